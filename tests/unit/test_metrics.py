"""drape's Prometheus metrics are a public API: dashboards and alerts depend on these names and labels."""

from drape.ops.metrics import REGISTRY

# Update on purpose (and the dashboards, rules and README with it).
EXPECTED = {
    "drape_data_wait_seconds": ("histogram", ["run", "stage", "rank"]),
    "drape_train_step_seconds": ("histogram", ["run", "stage", "rank"]),
    "drape_stage_step_seconds": ("gauge", ["run", "stage", "step"]),
    "drape_stage_finished_timestamp_seconds": ("gauge", ["run", "stage", "step"]),
    "drape_train_samples_per_second": ("gauge", ["run", "stage"]),
    "drape_train_steps": ("gauge", ["run", "stage"]),
    "drape_gate_check_value": ("gauge", ["run", "stage", "check", "aggregate"]),
    "drape_gate_check_threshold": ("gauge", ["run", "stage", "check"]),
    "drape_gate_passed": ("gauge", ["run", "stage"]),
    "drape_snapshot_promotions": ("counter", ["run", "stage"]),
    "drape_snapshot_baseline_version": ("gauge", ["run", "stage"]),
    "drape_archived_bytes": ("gauge", ["run", "stage"]),
    "drape_live_bytes": ("gauge", ["run", "stage"]),
    "drape_live_budget_bytes": ("gauge", ["run", "stage"]),
    "drape_prestage_bytes": ("gauge", ["run", "stage"]),
    "drape_prestage_downloaded_bytes": ("gauge", ["run", "stage"]),
    "drape_run_cost_dollars": ("gauge", ["run", "category"]),
    "drape_stage_cost_dollars": ("gauge", ["run", "stage", "promoted"]),
    "drape_gpu_price_dollars_per_hour": ("gauge", ["model", "plan"]),
    "drape_inference_latency_seconds": ("gauge", ["bench", "model", "variant", "scope", "quantile"]),
    "drape_inference_speedup": ("gauge", ["bench", "model", "variant"]),
    "drape_inference_peak_memory_bytes": ("gauge", ["bench", "model", "variant"]),
    "drape_inference_attention_cosine": ("gauge", ["bench", "model", "variant"]),
    "drape_inference_overlap": ("gauge", ["bench", "model", "variant", "concurrency"]),
    "drape_inference_approved": ("gauge", ["bench", "model", "variant"]),
    "drape_queue_jobs": ("gauge", ["state"]),
    "drape_engine_job_gpu_hours": ("gauge", ["job_id", "engine", "state"]),
    "drape_queue_wait_seconds": ("histogram", ["kind"]),
    "drape_queue_starved_jobs": ("gauge", []),
    "drape_queue_oldest_wait_seconds": ("gauge", []),
    "drape_queue_placements": ("counter", ["kind", "model"]),
    "drape_queue_preemptions": ("counter", ["kind"]),
    "drape_queue_placement_drift": ("counter", ["engine", "kind"]),
    "drape_queue_job_gpu_memory_gib": ("gauge", ["job_id", "kind", "run", "stage", "gpu", "node"]),
    "drape_gpu_memory_allocated_gib": ("gauge", ["gpu", "node", "model"]),
    "drape_gpu_memory_capacity_gib": ("gauge", ["gpu", "node", "model"]),
    "drape_queue_dispatch_cycle_seconds": ("histogram", []),
    "drape_queue_dispatch_errors": ("counter", []),
    "drape_queue_dispatcher_silent_seconds": ("gauge", ["run", "stage"]),
    "drape_queue_fleet_source": ("gauge", ["source"]),
    "drape_service_outages": ("counter", ["service", "outcome"]),
}


def test_metric_names_types_and_labels_are_unchanged():
    found = {}
    for collector in list(REGISTRY._collector_to_names):  # describe each metric without needing samples
        for metric in collector.describe():
            found[metric.name] = (metric.type, list(getattr(collector, "_labelnames", ())))
    assert found == EXPECTED


def test_every_metric_is_named_drape_and_documented():
    for collector in list(REGISTRY._collector_to_names):
        for metric in collector.describe():
            assert metric.name.startswith("drape_") and metric.documentation, metric.name

"""Flow runs push their series to a real Pushgateway, grouped by run and stage."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from drape.ops.metrics import DATA_WAIT, push_metrics


def _gateway_samples(url):
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def test_push_groups_by_run_and_stage_without_clobbering(config, pushgateway):
    cfg = config.model_copy(update={"metrics": config.metrics.model_copy(update={"pushgateway_url": pushgateway})})
    for stage, wait in (("identity", 0.002), ("texture", 0.004)):
        DATA_WAIT.labels(run="push-test", stage=stage, rank="0").observe(wait)
        assert push_metrics(cfg, {"run": "push-test", "stage": stage})
    counts = {
        s.labels["stage"]: s.value
        for s in _gateway_samples(pushgateway)
        if s.name == "drape_data_wait_seconds_count" and s.labels.get("run") == "push-test"
    }
    assert counts == {"identity": 1.0, "texture": 1.0}
    jobs = {s.labels.get("job") for s in _gateway_samples(pushgateway) if s.name == "drape_data_wait_seconds_count"}
    assert jobs == {"drape"}


def test_an_unreachable_gateway_is_reported_and_does_not_raise(config, capsys):
    cfg = config.model_copy(update={"metrics": config.metrics.model_copy(update={"pushgateway_url": "http://127.0.0.1:9/"})})
    assert push_metrics(cfg, {"run": "r", "stage": "identity"}) is False
    assert "metrics push to http://127.0.0.1:9" in capsys.readouterr().err

"""MLflow tracking and the model registry, through an explicit client (thread-safe, no global run).

One MLflow run per pipeline run (tagged with config and run id), one nested run per stage.
Each passed stage's checkpoint becomes a version of the registered model `drape-tryon` with the
alias ``<stage>-baseline``; the next run's gate reads its baseline through that alias.
"""

from __future__ import annotations

import os
from pathlib import Path

from drape import STAGES
from drape.config import PipelineConfig
from drape.ops.outage import refused_or_dropped, within_budget
from drape.secrets import redact

# plain text: the MLflow UI renders descriptions as Markdown, where "<stage>" would be read as an HTML tag
REGISTERED_MODEL_DESCRIPTION = (
    "drape try-on model. Each stage's validated baseline is an alias: " + ", ".join(f"{stage}-baseline" for stage in STAGES) + "."
)


class RegistryError(RuntimeError):
    """The model registry could not be read; never the same as "no baseline"."""


# MLflow's own defaults wait 120 s per request and retry 7 times with backoff: a tracking server
# that accepts and never answers held drape for many minutes. drape bounds each request to
# `tracking.max_wait_seconds` (60 s), connect, read and retries together: MLFLOW_HTTP_REQUEST_MAX_RETRIES
# retries of MLFLOW_HTTP_REQUEST_TIMEOUT each, and urllib3's backoff between them (factor 2: 0 s,
# then 4 s, each with up to 1 s of jitter). MLflow's standard variables, set in the environment, win.
MLFLOW_RETRIES = 2
MLFLOW_BACKOFF_SECONDS = 4 + 2 * 1.0  # the waits between MLFLOW_RETRIES + 1 attempts, jitter included
MLFLOW_HTTP_BOUNDS = ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES")
_SET_BY_DRAPE: dict[str, str] = {}


def mlflow_bounds(max_wait: float) -> dict[str, str]:
    """MLflow's per-request timeout and retries that fit `max_wait` seconds together."""
    timeout = max(1, int((max_wait - MLFLOW_BACKOFF_SECONDS) // (MLFLOW_RETRIES + 1)))
    return {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(MLFLOW_RETRIES)}


def _quiet_mlflow(max_wait: float) -> None:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    for name, value in mlflow_bounds(max_wait).items():
        if os.environ.get(name, _SET_BY_DRAPE.get(name)) == _SET_BY_DRAPE.get(name):  # unset, or drape's own
            os.environ[name] = _SET_BY_DRAPE[name] = value


def _refused(error: BaseException) -> bool:
    """Nothing reached the server: the connection refused, or a proxy's 502/503 (the server behind it
    down). A create call is retried only then; after a reset it may have been done once already."""
    text = str(error).lower()
    return any(
        word in text for word in ("connection refused", "bad gateway", "service unavailable", "too many 502", "too many 503")
    )


class PatientClient:
    """An MLflow client whose calls wait out a tracking server's restart within
    `tracking.max_wait_seconds` (`drape.ops.outage`): reads, logs, tags and artifact uploads after a
    refused or dropped connection; creations (a run, a model version) only when nothing reached the
    server, so a restart never makes a second run or version."""

    def __init__(self, client, shown: str, max_wait: float):
        self._client, self._shown, self._max_wait = client, shown, max_wait

    def __getattr__(self, name: str):
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute
        transient = _refused if name.startswith("create_") else refused_or_dropped

        def call(*args, **kwargs):
            return self.patiently(lambda: attribute(*args, **kwargs), transient)

        return call

    def patiently(self, call, transient=refused_or_dropped):
        return within_budget(
            call,
            service="mlflow",
            shown=self._shown,
            budget=self._max_wait,
            field="tracking.max_wait_seconds",
            is_transient=transient,
        )


class Tracker:
    """Thin wrapper over `MlflowClient` bound to one experiment."""

    def __init__(self, config: PipelineConfig, experiment: str | None = None):
        _quiet_mlflow(config.tracking.max_wait_seconds)
        from mlflow.tracking import MlflowClient

        self.uri, self.model_name = config.tracking_uri, config.tracking.registered_model
        if self.uri.startswith("sqlite:///"):
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)
        self.client: MlflowClient | PatientClient = client
        if self.uri.startswith(("http://", "https://")):  # a server that may restart mid-run
            self.client = PatientClient(client, redact(self.uri), config.tracking.max_wait_seconds)
        name = experiment or config.tracking.experiment
        found = self.client.get_experiment_by_name(name)
        if found is None:
            artifact_location = None
            if "://" not in self.uri or self.uri.startswith("sqlite"):
                artifact_location = Path(config.artifact_root).resolve().as_uri()
            self.experiment_id = self.client.create_experiment(name, artifact_location=artifact_location)
        else:
            self.experiment_id = found.experiment_id

    def start_run(self, name: str, tags: dict[str, str] | None = None, parent_run_id: str | None = None) -> str:
        tags = dict(tags or {})
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def run_link(self, run_id: str) -> str:
        """A browser link to the run on an MLflow server, or where to find it for a local store."""
        if self.uri.startswith("http"):
            return f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}"
        return f"run {run_id} in {self.uri}"

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def reopen_run(self, run_id: str) -> None:
        """A run resumed: RUNNING again (it may have been ended FAILED by an abort)."""
        self.client.update_run(run_id, status="RUNNING")

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        self.client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, str(value))

    def log_artifacts(self, run_id: str, local_dir: str | Path, artifact_path: str) -> str:
        self.client.log_artifacts(run_id, str(local_dir), artifact_path)
        return f"{self.client.get_run(run_id).info.artifact_uri}/{artifact_path}"

    def log_artifact(self, run_id: str, local_file: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(local_file), artifact_path)

    def _absent(self, error, what: str) -> bool:
        """True when `error` says `what` does not exist (a first run); any other registry error
        (auth, 5xx, the database) is raised as a RegistryError: it must never read as "no baseline"."""
        message = str(error)
        if error.error_code == "RESOURCE_DOES_NOT_EXIST" or (
            error.error_code == "INVALID_PARAMETER_VALUE" and "alias" in message and "not found" in message
        ):
            return True
        raise RegistryError(
            f"the MLflow registry at {redact(self.uri)} failed reading {what} ({error.error_code}: {redact(message)[:300]}); "
            "not treating it as 'no baseline': fix tracking.uri or the server and retry"
        ) from None

    def register_baseline(self, run_id: str, source: str, stage: str, tags: dict[str, str], *, alias: bool = True) -> str:
        """New model version from `source` (an artifact URI of `run_id`), aliased ``<stage>-baseline``
        unless `alias` is False (then `set_baseline_alias` commits it)."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(self.model_name)
        except MlflowException as error:
            self._absent(error, f"registered model {self.model_name}")
            self.client.create_registered_model(self.model_name, description=REGISTERED_MODEL_DESCRIPTION)
        version = self.client.create_model_version(self.model_name, source=source, run_id=run_id, tags=tags)
        if alias:
            self.set_baseline_alias(stage, str(version.version))
        return str(version.version)

    def set_baseline_alias(self, stage: str, version: str) -> None:
        """Point ``<stage>-baseline`` at `version` (one atomic registry update)."""
        self.client.set_registered_model_alias(self.model_name, f"{stage}-baseline", version)

    def get_baseline(self, stage: str):
        """The model version aliased ``<stage>-baseline``, or None on a first run."""
        return self.version_by_alias(f"{stage}-baseline")

    def version_by_alias(self, alias: str):
        """The model version `alias` points at, or None when no such alias exists."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version_by_alias(self.model_name, alias)
        except MlflowException as error:
            self._absent(error, f"alias {alias}")
            return None

    def set_version_tags(self, version: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_model_version_tag(self.model_name, version, key, str(value))

    def aliases(self) -> dict[str, str]:
        """alias → version of the registered model (empty before the first snapshot)."""
        from mlflow.exceptions import MlflowException

        try:
            return {alias: str(version) for alias, version in self.client.get_registered_model(self.model_name).aliases.items()}
        except MlflowException as error:
            self._absent(error, f"registered model {self.model_name}")
            return {}

    def download(self, artifact_uri: str, destination: str | Path) -> Path:
        from mlflow.artifacts import download_artifacts

        Path(destination).mkdir(parents=True, exist_ok=True)

        def fetch() -> str:
            return download_artifacts(artifact_uri=artifact_uri, dst_path=str(destination), tracking_uri=self.uri)

        return Path(self.client.patiently(fetch) if isinstance(self.client, PatientClient) else fetch())

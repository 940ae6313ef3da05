"""Config of the services a run reports to: tracking (MLflow), orchestration (Prefect) and alerts (Slack)."""

from __future__ import annotations

from pydantic import Field, model_validator

from drape import REGISTERED_MODEL
from drape.config.base import StrictModel, mounted


class TrackingConfig(StrictModel):
    uri: str | None = Field(
        default=None, description="MLflow URI; default sqlite:///<root>/mlflow.db", json_schema_extra=mounted("store")
    )
    artifact_root: str | None = Field(
        default=None,
        description="where MLflow stores run artifacts (s3://… at scale); default file://<root>/mlflow-artifacts",
        json_schema_extra=mounted("store"),
    )
    experiment: str = Field(default="drape", description="the MLflow experiment runs are logged under")
    registered_model: str = Field(
        default=REGISTERED_MODEL, description="the MLflow registered model; each stage's baseline is an alias of it"
    )
    max_wait_seconds: float = Field(
        default=60.0,
        ge=10,
        le=3600,
        description="the longest one MLflow request may take, connect, read and retries together (drape sets "
        "MLFLOW_HTTP_REQUEST_TIMEOUT and _MAX_RETRIES to fit it unless the environment sets them)",
    )


class OrchestrationConfig(StrictModel):
    max_wait_seconds: float = Field(
        default=60.0,
        ge=2,
        le=3600,
        description="the longest one Prefect API request may take, connect, read and the client's retries together "
        "(drape sets PREFECT_API_REQUEST_TIMEOUT and PREFECT_CLIENT_MAX_RETRIES to fit it unless the environment "
        "sets them; flows/budget.py); past it, an error naming the API URL",
    )


class AlertsConfig(StrictModel):
    slack_webhook_env: str = Field(
        default="DRAPE_SLACK_WEBHOOK_URL",
        description="name of the environment variable holding the webhook; never the URL itself",
    )
    slack_webhook_secret_block: str | None = Field(
        default=None, description="name of a Prefect Secret block holding the webhook (flows only); wins over the variable"
    )
    notify_on_pass: bool = Field(default=False, description="also post when a gate passes (failures are always posted)")

    @model_validator(mode="after")
    def _no_inline_secret(self) -> AlertsConfig:
        if "://" in self.slack_webhook_env:
            raise ValueError("slack_webhook_env names an environment variable, not the webhook URL")
        return self

"""Function configuration: environment variables validated once, so a missing one fails at start.

`template.yaml` sets these for every function; local mode sets them from the same template.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prewarm.domain.intervals import (
    AGENT_SILENCE_SECONDS,
    IMAGE_REMOVAL_GRACE_SECONDS,
    NO_AGENT_GRACE_SECONDS,
    REPORT_INTERVAL_SECONDS,
    STARTUP_TAINT_GRACE_SECONDS,
)
from prewarm.domain.registry_budget import (
    DEFAULT_REQUESTS_PER_SECOND,
    BudgetConfigError,
    RegistryBudget,
    RegistryBudgets,
)
from prewarm.domain.validation import describe_validation_error

if TYPE_CHECKING:
    from prewarm.domain.refresh import CredentialsConfig


class SettingsError(RuntimeError):
    """The function's environment is incomplete or wrong; names every variable at fault."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    table_name: str = Field(alias="TABLE_NAME", min_length=1)
    status_queue_url: str = Field(default="", alias="STATUS_QUEUE_URL")
    # Where the control plane probes clusters that parked jobs wait for (services/probes.py).
    probe_queue_url: str = Field(default="", alias="PROBE_QUEUE_URL")
    node_queue_prefix: str = Field(default="prewarm", alias="NODE_QUEUE_PREFIX", pattern=r"^[A-Za-z0-9_-]+$")
    node_dlq_arn: str = Field(default="", alias="NODE_DLQ_ARN")
    secret_prefix: str = Field(default="prewarm", alias="SECRET_PREFIX")
    cluster_name: str = Field(default="", alias="CLUSTER_NAME")
    kube_api_endpoint: str = Field(default="", alias="KUBE_API_ENDPOINT")
    kube_ca_data: str = Field(default="", alias="KUBE_CA_DATA", description="base64 PEM, as in kubeconfig")
    kubeconfig: str = Field(default="", alias="KUBECONFIG")
    node_silence_grace_seconds: int = Field(default=300, alias="NODE_SILENCE_GRACE_SECONDS", ge=0)
    task_resend_seconds: int = Field(default=300, alias="TASK_RESEND_SECONDS", ge=1)
    # A Pulling node silent this long is failed "agent not reporting" (docs/template.md, AgentSilenceSeconds).
    agent_silence_seconds: int = Field(
        default=AGENT_SILENCE_SECONDS, alias="AGENT_SILENCE_SECONDS", ge=int(4 * REPORT_INTERVAL_SECONDS)
    )
    # A node with no agent holds a round open this long, then fails "no agent on node" (NoAgentGraceSeconds).
    no_agent_grace_seconds: int = Field(default=NO_AGENT_GRACE_SECONDS, alias="NO_AGENT_GRACE_SECONDS", ge=0)
    # A startup taint no agent removed by its deadline: the sweep removes it this much later.
    startup_taint_grace_seconds: int = Field(default=STARTUP_TAINT_GRACE_SECONDS, alias="STARTUP_TAINT_GRACE_SECONDS",
                                             ge=0)
    # How long an image no live job wants stays on its nodes before its agent removes it; -1: for ever.
    image_removal_grace_seconds: int = Field(default=IMAGE_REMOVAL_GRACE_SECONDS, alias="IMAGE_REMOVAL_GRACE_SECONDS",
                                             ge=-1, le=10 * 365 * 86_400)
    # The agent reads the same variable for the visibility timeout of its receives.
    node_queue_visibility_seconds: int = Field(default=120, alias="NODE_QUEUE_VISIBILITY_SECONDS", ge=0)
    node_queue_sender_arns_csv: str = Field(default="", alias="NODE_QUEUE_SENDER_ARNS")
    # The credential refresher's configuration: an SSM parameter holding it wins over the JSON itself.
    # Warm snapshots' builders: their instance profile (the only role the stack may pass) and agent image.
    builder_instance_profile_arn: str = Field(default="", alias="BUILDER_INSTANCE_PROFILE_ARN")
    builder_agent_image: str = Field(default="", alias="BUILDER_AGENT_IMAGE")
    aws_region: str = Field(default="", alias="AWS_REGION")
    credentials_config_parameter: str = Field(default="", alias="CREDENTIALS_CONFIG_PARAMETER")
    credentials_config_json: str = Field(default="", alias="CREDENTIALS_CONFIG")
    # Each registry's request budget (docs/template.md, RegistryRequestsPerSecond): 0 turns pacing off.
    registry_requests_per_second: float = Field(default=DEFAULT_REQUESTS_PER_SECOND,
                                                alias="REGISTRY_REQUESTS_PER_SECOND", ge=0, allow_inf_nan=False)
    registry_bytes_per_second: float = Field(default=0, alias="REGISTRY_BYTES_PER_SECOND", ge=0, allow_inf_nan=False)
    registry_budgets_json: str = Field(default="", alias="REGISTRY_BUDGETS")
    # The cron jobs' EventBridge Scheduler schedules (dispatch_job puts them): their name prefix, the run
    # function they invoke and the role Scheduler invokes it as.
    cron_schedule_prefix: str = Field(default="prewarm-cron", alias="CRON_SCHEDULE_PREFIX",
                                      pattern=r"^[0-9A-Za-z_.-]{1,40}$")
    cron_target_arn: str = Field(default="", alias="CRON_TARGET_ARN")
    cron_role_arn: str = Field(default="", alias="CRON_ROLE_ARN")

    @property
    def image_removal_grace(self) -> int | None:
        """Seconds until an image no job wants is removed from its nodes; None: never (-1)."""
        return None if self.image_removal_grace_seconds < 0 else self.image_removal_grace_seconds

    @property
    def node_queue_sender_arns(self) -> list[str]:
        """Roles allowed to send to node queues (the queue policy); empty leaves IAM alone to decide."""
        return [a.strip() for a in self.node_queue_sender_arns_csv.split(",") if a.strip()]

    def credentials_config(self, read_parameter: Callable[[str], str]) -> CredentialsConfig | None:
        """The refresher's configuration; None when none is set: there is nothing to refresh.

        `CREDENTIALS_CONFIG_PARAMETER` (an SSM parameter, read with `read_parameter` on every call so a
        changed parameter applies at once) wins over `CREDENTIALS_CONFIG` (JSON).
        """
        from prewarm.domain.refresh import CredentialsConfig

        if parameter := self.credentials_config_parameter.strip():
            return CredentialsConfig.parse(read_parameter(parameter), f"CREDENTIALS_CONFIG_PARAMETER {parameter}")
        if text := self.credentials_config_json.strip():
            return CredentialsConfig.parse(text, "CREDENTIALS_CONFIG")
        return None

    def registry_budgets(self) -> RegistryBudgets:
        """The stack's registry budgets: the default and `REGISTRY_BUDGETS`' per-host overrides."""
        default = RegistryBudget(requests_per_second=self.registry_requests_per_second,
                                 bytes_per_second=self.registry_bytes_per_second or None)
        text = self.registry_budgets_json.strip()
        try:
            overrides = json.loads(text) if text else {}
            if not isinstance(overrides, dict):
                raise BudgetConfigError("expected an object of registry host to budget")
            return RegistryBudgets.parse(default, overrides)
        except (json.JSONDecodeError, BudgetConfigError) as e:
            raise SettingsError(f"invalid REGISTRY_BUDGETS: {e}") from None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        try:
            read = cls.model_validate(dict(env))
        except ValidationError as e:
            problems = describe_validation_error(e, subject="")
            raise SettingsError(f"invalid function environment: {problems}") from None
        # Checked at cold start, not at the first send of tasks: a bad entry fails every function at once,
        # naming the entry.
        read.registry_budgets()
        return read


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process's settings, read from the environment on first use."""
    return Settings.from_env(os.environ)

"""The agent's configuration: environment variables validated once at start, errors naming the variable.

Every variable is documented in docs/agent.md. In a pod, `NODE_NAME` comes from the downward API
(`spec.nodeName`) and the Kubernetes API defaults to the in-cluster service account.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prewarm.domain.clusters import CLUSTER_NAME_MAX, CLUSTER_NAME_PATTERN
from prewarm.domain.liveness import REPORT_INTERVAL_SECONDS
from prewarm.domain.validation import Loc, describe_validation_error
from prewarm.domain.warming import DEFAULT_MAX_WARM_SECONDS, DEFAULT_TAINT_KEY, StartupTaint

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_CRI_SOCKET = "/run/containerd/containerd.sock"
# Where EKS nodes' containerd reads per-registry hosts.toml files (its `config_path`).
DEFAULT_REGISTRY_CONFIG_PATH = "/etc/containerd/certs.d"
SQS_MAX_VISIBILITY_SECONDS = 12 * 3600
# The template's SecretPrefix: Secrets Manager name characters, `/`-separated, no empty part.
SECRET_PREFIX_PATTERN = r"^([A-Za-z0-9_+=.@-]+(/[A-Za-z0-9_+=.@-]+)*)?$"
# A taint key is a qualified name: an optional DNS subdomain prefix and `/`, then a name.
TAINT_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"


class EcrCredentials(StrEnum):
    """Where the agent's ECR tokens come from (`ECR_CREDENTIALS`)."""

    SHARED = "shared"  # the refresher's copy under SECRET_PREFIX first; its own role when there is none
    ROLE = "role"  # its own role first; the refresher's copy under SECRET_PREFIX when ECR refuses
    COPIES = "copies"  # only the refresher's copies: for roles without ecr:GetAuthorizationToken


class AgentSettingsError(ValueError):
    """The agent's environment is incomplete or wrong; the message names every variable at fault."""


class AgentSettings(BaseModel):
    """The agent's settings; build with `from_env`. Field aliases are the environment variable names."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    node_name: str = Field(alias="NODE_NAME", min_length=1)
    # The registered cluster the node is in, as `prewarm cluster add` named it; empty in the stack's own.
    cluster: str = Field(default="", alias="PREWARM_CLUSTER", max_length=CLUSTER_NAME_MAX,
                         pattern=f"^$|{CLUSTER_NAME_PATTERN}")
    node_queue_prefix: str = Field(alias="NODE_QUEUE_PREFIX", pattern=r"^[A-Za-z0-9_-]+$")
    status_queue_url: str = Field(alias="STATUS_QUEUE_URL", pattern=r"^https?://\S+/\S+$")
    aws_region: str = Field(alias="AWS_REGION", min_length=1)
    aws_endpoint_url: str | None = Field(default=None, alias="AWS_ENDPOINT_URL")
    cri_socket: str = Field(default=DEFAULT_CRI_SOCKET, alias="CRI_SOCKET", min_length=1)
    max_concurrent_pulls: int = Field(default=2, alias="MAX_CONCURRENT_PULLS", ge=1, le=64)
    disk_threshold_percent: float = Field(default=85.0, alias="DISK_THRESHOLD_PERCENT", gt=0, le=100)
    # One ListImages this often looks for images garbage collection removed after they were pulled (0: never).
    image_check_interval_seconds: float = Field(default=300.0, alias="IMAGE_CHECK_INTERVAL_SECONDS", ge=0)
    # The record of what the agent pulled (`pulled`), which survives restarts there (a hostPath; "": in
    # memory only), and how often images due for removal are removed and the footprint sent.
    state_dir: str = Field(default="", alias="STATE_DIR")
    removal_check_interval_seconds: float = Field(default=60.0, alias="REMOVAL_CHECK_INTERVAL_SECONDS", gt=0)
    node_queue_visibility_seconds: int = Field(
        default=120, alias="NODE_QUEUE_VISIBILITY_SECONDS", ge=3, le=SQS_MAX_VISIBILITY_SECONDS
    )
    heartbeat_seconds: float | None = Field(default=None, alias="HEARTBEAT_INTERVAL_SECONDS", gt=0)
    # Longer than the report interval the control plane expects, a running pull reads as "agent not reporting".
    progress_interval_seconds: float = Field(default=REPORT_INTERVAL_SECONDS, alias="PROGRESS_INTERVAL_SECONDS", gt=0)
    receive_wait_seconds: int = Field(default=20, alias="RECEIVE_WAIT_SECONDS", ge=0, le=20)
    registry_allowlist_csv: str = Field(default="", alias="REGISTRY_ALLOWLIST")
    registry_config_path: str = Field(default=DEFAULT_REGISTRY_CONFIG_PATH, alias="REGISTRY_CONFIG_PATH")
    # containerd's config, read for `use_local_image_pull` only ("": not read).
    containerd_config: str = Field(default="", alias="CONTAINERD_CONFIG")
    secret_prefix: str = Field(default="", alias="SECRET_PREFIX", pattern=SECRET_PREFIX_PATTERN)
    ecr_credentials: EcrCredentials = Field(default=EcrCredentials.SHARED, alias="ECR_CREDENTIALS")
    kube_api_endpoint: str = Field(default="", alias="KUBE_API_ENDPOINT")
    kube_token_file: str = Field(default=str(SERVICE_ACCOUNT_DIR / "token"), alias="KUBE_TOKEN_FILE")
    kube_bearer_token: str = Field(default="", alias="KUBE_BEARER_TOKEN", repr=False)
    kube_ca_file: str = Field(default=str(SERVICE_ACCOUNT_DIR / "ca.crt"), alias="KUBE_CA_FILE")
    http_bind_address: str = Field(default="0.0.0.0", alias="HTTP_BIND_ADDRESS", min_length=1)
    http_port: int = Field(default=9102, alias="HTTP_PORT", ge=0, le=65535)
    shutdown_grace_seconds: float = Field(default=25.0, alias="SHUTDOWN_GRACE_SECONDS", ge=0)
    startup_taint_key: str = Field(default=DEFAULT_TAINT_KEY, alias="STARTUP_TAINT_KEY", pattern=TAINT_KEY_PATTERN)
    startup_taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="NoSchedule", alias="STARTUP_TAINT_EFFECT"
    )
    max_warm_seconds: float = Field(default=DEFAULT_MAX_WARM_SECONDS, alias="MAX_WARM_SECONDS", gt=0)
    log_level: str = Field(default="INFO", alias="LOG_LEVEL")

    @field_validator("aws_endpoint_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return value or None

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in logging.getLevelNamesMapping():
            raise ValueError(f"{value!r} is not a log level: use DEBUG, INFO, WARNING or ERROR")
        return level

    @field_validator("registry_allowlist_csv")
    @classmethod
    def _globs_without_scheme(cls, value: str) -> str:
        for glob in value.split(","):
            if "/" in glob:
                raise ValueError(f"{glob.strip()!r} must be a registry host glob (no scheme or path)")
        return value

    @model_validator(mode="after")
    def _heartbeat_inside_visibility(self) -> AgentSettings:
        if self.heartbeat_seconds is not None and self.heartbeat_seconds >= self.node_queue_visibility_seconds:
            raise ValueError(
                f"HEARTBEAT_INTERVAL_SECONDS ({self.heartbeat_seconds:g}) must be shorter than "
                f"NODE_QUEUE_VISIBILITY_SECONDS ({self.node_queue_visibility_seconds})"
            )
        return self

    @model_validator(mode="after")
    def _copies_need_a_prefix(self) -> AgentSettings:
        if self.ecr_credentials is EcrCredentials.COPIES and not self.secret_prefix:
            raise ValueError(
                "ECR_CREDENTIALS=copies reads the registry copies under SECRET_PREFIX: set SECRET_PREFIX to the "
                "stack output SecretPrefix, or use ECR_CREDENTIALS=role"
            )
        return self

    @property
    def heartbeat_interval_seconds(self) -> float:
        """How often held messages get their visibility extended: a third of the timeout unless set."""
        return self.heartbeat_seconds or self.node_queue_visibility_seconds / 3

    @property
    def startup_taint(self) -> StartupTaint:
        """The taint a new node holds until its images are present (docs/agent.md, "Startup taint")."""
        return StartupTaint(self.startup_taint_key, self.startup_taint_effect)

    @property
    def registry_allowlist(self) -> tuple[str, ...]:
        """Registry host globs the agent pulls from; empty allows every registry."""
        return tuple(glob.strip().lower() for glob in self.registry_allowlist_csv.split(",") if glob.strip())

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AgentSettings:
        """Validate `env`; raise `AgentSettingsError` naming each variable that is missing or wrong."""
        values = dict(env)
        if not values.get("KUBE_API_ENDPOINT") and values.get("KUBERNETES_SERVICE_HOST"):
            host = values["KUBERNETES_SERVICE_HOST"]
            host = f"[{host}]" if ":" in host else host
            values["KUBE_API_ENDPOINT"] = f"https://{host}:{values.get('KUBERNETES_SERVICE_PORT', '443')}"
        try:
            return cls.model_validate(values)
        except ValidationError as e:
            problems = describe_validation_error(e, subject="settings", path=_variable)
            raise AgentSettingsError(f"invalid agent environment: {problems}") from None


_ALIASES = {name: str(info.alias) for name, info in AgentSettings.model_fields.items()}


def _variable(loc: Loc) -> str:
    """The environment variable a settings field is read from."""
    field = str(loc[0]) if loc else ""
    return _ALIASES.get(field, field)

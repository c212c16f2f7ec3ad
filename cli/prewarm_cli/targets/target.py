"""A target: the table and queues of one Prewarm stack, and how to reach them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prewarm.adapters.dynamodb import DynamoJobStore
    from prewarm.adapters.kube import KubeCluster
    from prewarm.adapters.scheduler import SchedulerCronSchedules
    from prewarm.adapters.sqs import NodeQueues

# Local stacks accept any credentials; fixed ones keep real ones from ever being sent to them.
_LOCAL_CREDENTIALS = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}


class TargetError(Exception):
    """No usable stack to operate on; the message says what to pass or start. Exit code 2 is a usage problem."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code




@dataclass(frozen=True)
class Target:
    """The table and queues of one stack, and how to reach them."""

    description: str
    table_name: str
    status_queue_url: str
    node_queue_prefix: str
    node_dlq_arn: str = ""
    node_queue_sender_arns: tuple[str, ...] = ()
    region: str | None = None
    endpoint_url: str | None = None
    local: bool = False
    #: The stack's settings as the functions' environment names them (CLUSTER_NAME, SECRET_PREFIX, ...).
    env: Mapping[str, str] = field(default_factory=dict)

    def session(self, region: str | None = None) -> Any:
        import boto3

        credentials = _LOCAL_CREDENTIALS if self.local else {}
        return boto3.session.Session(region_name=region or self.region, **credentials)

    def client(self, service: str, region: str | None = None) -> Any:
        """A client of `service` in the stack's Region, or in `region`."""
        from botocore.config import Config

        # A CLI should fail in seconds, not retry for a minute, when the endpoint is down.
        config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=3 if self.local else 10,
                        read_timeout=30, max_pool_connections=32)
        return self.session(region).client(service, endpoint_url=self.endpoint_url, config=config)

    def store(self) -> DynamoJobStore:
        from prewarm.adapters.dynamodb import DynamoJobStore

        return DynamoJobStore(self.table_name, client=self.client("dynamodb"))

    def queues(self) -> NodeQueues:
        from prewarm.adapters.sqs import NodeQueues

        # Queues a cancel has to create get the same redrive and policy as the control plane's.
        return NodeQueues(self.node_queue_prefix, self.status_queue_url, dlq_arn=self.node_dlq_arn,
                          sender_arns=self.node_queue_sender_arns, client=self.client("sqs"))

    def cron_schedules(self) -> SchedulerCronSchedules | None:
        """The cron jobs' schedules, to read (`scheduler:GetSchedule`); None when the stack names no prefix."""
        from prewarm.adapters.scheduler import SchedulerCronSchedules

        prefix = self.env.get("CRON_SCHEDULE_PREFIX")
        return SchedulerCronSchedules(prefix, "", "", client=self.client("scheduler")) if prefix else None

    def cluster(self, kubeconfig: str | None = None, context: str | None = None) -> KubeCluster:
        """The stack's cluster as the caller: a kubeconfig's user, or an EKS token from these AWS credentials
        for the cluster the stack names (its endpoint from the stack, else `eks:DescribeCluster`)."""
        from prewarm.adapters.kube import KubeCluster
        from prewarm.services.ports import ClusterConfigError
        from prewarm.settings import Settings

        if kubeconfig:
            return KubeCluster.from_kubeconfig(kubeconfig, context)
        if self.local and not self.env.get("KUBE_API_ENDPOINT"):
            # Never ask AWS's real EKS about a local stack's cluster name.
            raise ClusterConfigError(f"{self.description} serves no Kubernetes API: pass --kubeconfig")
        names = {"CLUSTER_NAME", "KUBE_API_ENDPOINT", "KUBE_CA_DATA"}
        settings = Settings.from_env({**{k: v for k, v in self.env.items() if k in names},
                                      "TABLE_NAME": self.table_name})
        if not settings.cluster_name:
            raise ClusterConfigError(f"{self.description} names no EKS cluster: pass --kubeconfig")
        return KubeCluster.from_settings(settings, session=self.session())


def target_from_env(env: Mapping[str, str], *, description: str, region: str | None, endpoint_url: str | None,
                    local: bool) -> Target:
    """A target from the functions' environment variables (TABLE_NAME, STATUS_QUEUE_URL, ...)."""
    from prewarm.settings import Settings, SettingsError

    try:
        settings = Settings.from_env(env)
    except SettingsError as e:
        raise TargetError(f"{description}: {e}") from None
    return Target(
        description=description, table_name=settings.table_name, status_queue_url=settings.status_queue_url,
        node_queue_prefix=settings.node_queue_prefix, node_dlq_arn=settings.node_dlq_arn,
        node_queue_sender_arns=tuple(settings.node_queue_sender_arns), region=region,
        endpoint_url=endpoint_url, local=local, env=dict(env),
    )



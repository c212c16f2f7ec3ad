"""A deployed stack, found by name: its outputs (`JobsTableName`, `StatusQueueUrl`, `NodeQueuePrefix`,
`NodeDLQArn`) name the table and queues. boto3 is imported only when a target is built."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from prewarm_cli.targets.target import Target, TargetError, target_from_env

# Stack output → function environment variable it stands for.
STACK_OUTPUTS = {
    "PrewarmVersion": "PREWARM_VERSION",
    "JobsTableName": "TABLE_NAME",
    "StatusQueueUrl": "STATUS_QUEUE_URL",
    "NodeQueuePrefix": "NODE_QUEUE_PREFIX",
    "NodeDLQArn": "NODE_DLQ_ARN",
    "SecretPrefix": "SECRET_PREFIX",
    "NodeQueueSenderArns": "NODE_QUEUE_SENDER_ARNS",
    "ClusterName": "CLUSTER_NAME",
    "KubeApiEndpoint": "KUBE_API_ENDPOINT",
    "KubeCaData": "KUBE_CA_DATA",
    "AgentRoleArn": "AGENT_ROLE_ARN",
    "DeadLetterQueueUrls": "DEAD_LETTER_QUEUE_URLS",
    "DispatchJobRoleArn": "DISPATCH_JOB_ROLE_ARN",
    "RecordStatusRoleArn": "RECORD_STATUS_ROLE_ARN",
    "SweepRoleArn": "SWEEP_ROLE_ARN",
    "RefreshEcrCredentialsRoleArn": "REFRESH_ECR_CREDENTIALS_ROLE_ARN",
    "SyncResourcesRoleArn": "SYNC_RESOURCES_ROLE_ARN",
    "RunCronJobRoleArn": "RUN_CRON_JOB_ROLE_ARN",
    "BakeSnapshotsRoleArn": "BAKE_SNAPSHOTS_ROLE_ARN",
    # Where `describe cronjob` finds the cron jobs' schedules.
    "CronSchedulePrefix": "CRON_SCHEDULE_PREFIX",
    # The function `cluster add` invokes to check a cluster from the stack's network.
    "SyncResourcesFunctionName": "SYNC_RESOURCES_FUNCTION_NAME",
}
# Stack parameters the CLI reads: what the credential refresher writes into the cluster (`prewarm install`),
# and the sweep's graces.
STACK_PARAMETERS = {
    "CredentialsConfig": "CREDENTIALS_CONFIG",
    "CredentialsConfigParameter": "CREDENTIALS_CONFIG_PARAMETER",
    # When the sweep removes a startup taint no agent removed (`get nodes` says when).
    "StartupTaintGraceSeconds": "STARTUP_TAINT_GRACE_SECONDS",
    # When the sweep removes the startup taint of a Ready node whose agent never said hello (`get nodes` too).
    "NoAgentGraceSeconds": "NO_AGENT_GRACE_SECONDS",
}
_REQUIRED_OUTPUTS = ("JobsTableName", "StatusQueueUrl", "NodeQueuePrefix")


def stack_target(stack_name: str, *, region: str | None = None, cloudformation: Any = None) -> Target:
    """A deployed stack, found by its CloudFormation name; its outputs name the table and queues."""
    from botocore.exceptions import ClientError, NoRegionError

    try:
        client = cloudformation
        if client is None:
            import boto3

            client = boto3.session.Session(region_name=region).client("cloudformation")
        stacks = client.describe_stacks(StackName=stack_name)["Stacks"]
    except NoRegionError:
        raise TargetError(
            f"no AWS region to look up stack {stack_name!r} in: pass --region or set AWS_REGION", exit_code=2
        ) from None
    except ClientError as e:
        message = e.response.get("Error", {}).get("Message", str(e))
        if "does not exist" in message:
            raise TargetError(f"stack {stack_name!r} not found in {client.meta.region_name}") from None
        raise TargetError(f"cannot read stack {stack_name!r}: {message}") from None
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stacks[0].get("Outputs", [])}
    missing = [key for key in _REQUIRED_OUTPUTS if not outputs.get(key)]
    if missing:
        raise TargetError(
            f"stack {stack_name!r} has no output {', '.join(missing)}: is it a Prewarm stack, fully deployed?"
        )
    env = {variable: outputs[key] for key, variable in STACK_OUTPUTS.items() if outputs.get(key)}
    parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in stacks[0].get("Parameters", [])}
    env.update({variable: parameters[key] for key, variable in STACK_PARAMETERS.items() if parameters.get(key)})
    actual_region = client.meta.region_name
    return target_from_env(env, description=f"stack {stack_name} ({actual_region})", region=actual_region,
                           endpoint_url=None, local=False)



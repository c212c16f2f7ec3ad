"""template.yaml: the wiring the handlers rely on, and least privilege, checked on the parsed template.

cfn-lint (run by `make template`) checks the CloudFormation schema; these tests check what it cannot:
our event patterns, filters and batch settings, IAM scoping, alarms, and that the handlers exist.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from prewarm.settings import Settings
from prewarm_devtools.sam.template import load_template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
EVENTS = ROOT / "events"


@cache
def template() -> dict[str, Any]:
    """The template as SAM loads it (its constructor for CloudFormation's short tags)."""
    return load_template(TEMPLATE)


def resources(kind: str | None = None) -> dict[str, dict[str, Any]]:
    everything: dict[str, dict[str, Any]] = template()["Resources"]
    return {name: r for name, r in everything.items() if kind is None or r["Type"] == kind}


def functions() -> dict[str, dict[str, Any]]:
    return resources("AWS::Serverless::Function")


def props(name: str) -> dict[str, Any]:
    found: dict[str, Any] = resources()[name].get("Properties", {})
    return found


def globals_env() -> dict[str, Any]:
    env: dict[str, Any] = template()["Globals"]["Function"]["Environment"]["Variables"]
    return env


def function_setting(name: str, key: str) -> Any:
    """A function property, falling back to Globals as SAM does."""
    return props(name).get(key, template()["Globals"]["Function"].get(key))


def events_of(kind: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for fn, r in functions().items():
        for event_name, event in r["Properties"].get("Events", {}).items():
            if event["Type"] == kind:
                yield fn, event_name, event["Properties"]


def getatt_target(value: Any) -> str | None:
    """`X` of `!GetAtt X.Arn` (any attribute), else None."""
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return str(value["Fn::GetAtt"][0])
    return None


def branches(value: Any) -> Iterator[Any]:
    """Every value an `!If` can take (both branches), leaving out AWS::NoValue."""
    if isinstance(value, dict) and "Fn::If" in value:
        for branch in value["Fn::If"][1:]:
            yield from branches(branch)
    elif value != {"Ref": "AWS::NoValue"}:
        yield value


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def policy_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every permission policy in the template (identity and resource policies; not trust policies)."""
    for name, r in resources().items():
        p = r.get("Properties", {})
        if r["Type"] == "AWS::IAM::Role":
            for policy in p.get("Policies", []):
                yield name, policy["PolicyDocument"]
        elif r["Type"] in {"AWS::IAM::ManagedPolicy", "AWS::SQS::QueuePolicy", "AWS::IAM::Policy"}:
            yield name, p["PolicyDocument"]
        elif r["Type"] == "AWS::Serverless::Function" and "Policies" in p:
            yield name, {"Statement": [s for doc in as_list(p["Policies"]) for s in doc.get("Statement", [])]}


def statements(allow_only: bool = True) -> Iterator[tuple[str, dict[str, Any]]]:
    for owner, document in policy_documents():
        for raw in document["Statement"]:
            for statement in branches(raw):
                if not allow_only or statement["Effect"] == "Allow":
                    yield owner, statement


def settings_alias(field: str) -> str:
    alias = Settings.model_fields[field].alias
    assert alias is not None
    return str(alias)


# -- handlers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("function", sorted(functions()))
def test_every_function_code_folder_has_its_handler(function: str) -> None:
    # Given the function's CodeUri and Handler
    code = ROOT / props(function)["CodeUri"]
    module, handler = props(function)["Handler"].rsplit(".", 1)
    source = code / f"{module.replace('.', '/')}.py"
    # Then the module exists and defines the handler at top level (read, not imported)
    assert source.is_file(), f"{function}: {source.relative_to(ROOT)} is missing"
    tree = ast.parse(source.read_text(), filename=str(source))
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert handler in defined, f"{function}: {source.relative_to(ROOT)} does not define {handler}"


def test_layers_built_by_a_makefile_have_its_build_target_for_their_logical_id() -> None:
    # Given the layers sam build builds with `BuildMethod: makefile`, the shared layer among them
    built = {name: layer for name, layer in resources("AWS::Serverless::LayerVersion").items()
             if layer.get("Metadata", {}).get("BuildMethod") == "makefile"}
    assert "SharedLayer" in built
    for name, layer in built.items():
        # Then sam build finds `build-<LogicalId>` in the Makefile of the layer's ContentUri
        makefile = ROOT / layer["Properties"]["ContentUri"] / "Makefile"
        assert re.search(rf"^build-{name}:", makefile.read_text(), re.MULTILINE), f"{makefile} lacks build-{name}"


def test_each_function_names_its_own_service_after_its_code_folder() -> None:
    for name in functions():
        folder = Path(props(name)["CodeUri"]).name
        assert props(name)["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"] == folder, name


# -- event sources ----------------------------------------------------------------------------


def _event_of(function: str, kind: str, name: str | None = None) -> dict[str, Any]:
    [(_, _, event)] = [e for e in events_of(kind) if e[0] == function and name in (None, e[1])]
    return event


def test_image_push_rule_matches_only_successful_ecr_pushes() -> None:
    rule = _event_of("OnImagePushFunction", "EventBridgeRule", "EcrPush")
    assert rule["Pattern"] == {
        "source": ["aws.ecr"],
        "detail-type": ["ECR Image Action"],
        "detail": {"action-type": ["PUSH"], "result": ["SUCCESS"]},
    }
    assert rule["RetryPolicy"] == {"MaximumRetryAttempts": 4, "MaximumEventAgeInSeconds": 3600}
    assert getatt_target(rule["DeadLetterConfig"]["Arn"]) == "ImagePushDLQ"


def _matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    """EventBridge matching for the exact-value patterns this template uses."""
    for key, wanted in pattern.items():
        value = event.get(key)
        if isinstance(wanted, dict):
            if not isinstance(value, dict) or not _matches(wanted, value):
                return False
        elif value not in wanted:
            return False
    return True


@pytest.mark.parametrize(
    ("event_file", "delivered"),
    [
        ("ecr_push.json", True),
        ("ecr_push_index.json", True),
        ("ecr_push_failed.json", False),
        ("ecr_delete.json", False),
    ],
)
def test_sample_ecr_events_reach_on_image_push_only_when_a_push_succeeded(event_file: str, delivered: bool) -> None:
    rule = _event_of("OnImagePushFunction", "EventBridgeRule", "EcrPush")
    event = json.loads((EVENTS / event_file).read_text())
    assert _matches(rule["Pattern"], event) is delivered


@pytest.mark.parametrize(("rule_name", "event_file"), [("EcrReplication", "ecr_replication.json"),
                                                        ("EcrPullThroughCache", "ecr_pull_through_cache.json")])
def test_successful_replications_and_pull_through_cache_syncs_reach_on_image_push(rule_name: str,
                                                                                  event_file: str) -> None:
    rule = _event_of("OnImagePushFunction", "EventBridgeRule", rule_name)
    event = json.loads((EVENTS / event_file).read_text())
    assert _matches(rule["Pattern"], event)
    assert getatt_target(rule["DeadLetterConfig"]["Arn"]) == "ImagePushDLQ"
    failed = json.loads(json.dumps(event).replace('"SUCCESS"', '"FAILED"'))
    assert not _matches(rule["Pattern"], failed)


def test_warm_snapshots_take_their_stream_items_and_ebs_snapshot_notifications_only() -> None:
    stream = _event_of("BakeSnapshotsFunction", "DynamoDB")
    assert getatt_target(stream["Stream"]) == "JobsTable"
    [only] = stream["FilterCriteria"]["Filters"]
    assert json.loads(only["Pattern"]) == {"dynamodb": {"Keys": {"sk": {"S": ["WARMSNAPSHOT"]}}}}
    rule = _event_of("BakeSnapshotsFunction", "EventBridgeRule")
    assert rule["Pattern"] == {"source": ["aws.ec2"], "detail-type": ["EBS Snapshot Notification"],
                               "detail": {"event": ["createSnapshot"]}}
    sample = json.loads((EVENTS / "ebs_snapshot_notification.json").read_text())
    assert _matches(rule["Pattern"], sample) and not any(
        _matches(e["Pattern"], sample) for f, _, e in events_of("EventBridgeRule") if f == "OnImagePushFunction")


def test_job_stream_delivers_only_job_items_with_partial_batch_failures() -> None:
    stream = _event_of("DispatchJobFunction", "DynamoDB")
    assert getatt_target(stream["Stream"]) == "JobsTable"
    [only] = stream["FilterCriteria"]["Filters"]
    # Job items, and cron job items (their schedules follow them)
    assert json.loads(only["Pattern"]) == {"dynamodb": {"Keys": {"sk": {"S": ["JOB", "CRON"]}}}}
    assert stream["StartingPosition"] == "LATEST"
    assert stream["BatchSize"] == 10
    assert stream["MaximumRetryAttempts"] == 10
    assert stream["BisectBatchOnFunctionError"] is True
    assert stream["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert getatt_target(stream["DestinationConfig"]["OnFailure"]["Destination"]) == "DispatchDLQ"


def test_queue_event_sources_report_partial_batch_failures() -> None:
    queues = list(events_of("SQS"))
    assert {(f, getatt_target(s["Queue"])) for f, _, s in queues} == {
        ("RecordStatusFunction", "StatusQueue"), ("RecordStatusFunction", "ProbeQueue")}
    for function, event_name, source in queues:
        assert source.get("FunctionResponseTypes") == ["ReportBatchItemFailures"], f"{function}.{event_name}"
    # Batches of StatusBatchSize reports with a window (Lambda requires one above 10), at most
    # StatusConcurrency in flight
    [source] = [s for _, _, s in queues if getatt_target(s["Queue"]) == "StatusQueue"]
    assert source["BatchSize"] == {"Ref": "StatusBatchSize"}
    assert source["MaximumBatchingWindowInSeconds"] >= 1
    assert source["ScalingConfig"]["MaximumConcurrency"] == {"Ref": "StatusConcurrency"}
    # Probes apart: one waiting on a hung API holds up no report; Lambda's least concurrency, 2
    [probes] = [s for _, _, s in queues if getatt_target(s["Queue"]) == "ProbeQueue"]
    assert probes["BatchSize"] <= 10 and probes["ScalingConfig"]["MaximumConcurrency"] == 2


def test_status_capacity_is_parameters_within_what_lambda_accepts() -> None:
    params = template()["Parameters"]
    # Lambda's MaximumConcurrency is 2..1000; a batch over 10 needs the 1 s window the mapping has.
    assert {k: params["StatusConcurrency"].get(k) for k in ("Type", "Default", "MinValue", "MaxValue")} == {
        "Type": "Number", "Default": 10, "MinValue": 2, "MaxValue": 1000}
    assert {k: params["StatusBatchSize"].get(k) for k in ("Default", "MinValue", "MaxValue")} == {
        "Default": 100, "MinValue": 10, "MaxValue": 1000}
    # 0 reserves nothing (a reservation of 0 would throttle every invocation).
    assert (params["StatusReservedConcurrency"]["Default"], params["StatusReservedConcurrency"]["MinValue"]) == (0, 0)
    assert props("RecordStatusFunction")["ReservedConcurrentExecutions"] == {
        "Fn::If": ["HasStatusReservedConcurrency", {"Ref": "StatusReservedConcurrency"}, {"Ref": "AWS::NoValue"}]}
    assert template()["Conditions"]["HasStatusReservedConcurrency"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "StatusReservedConcurrency"}, 0]}]}


def test_status_queue_outlasts_six_record_status_timeouts_and_redrives_to_its_dlq() -> None:
    for function, _, source in events_of("SQS"):
        queue = props(getatt_target(source["Queue"]) or "")
        assert queue["VisibilityTimeout"] >= 6 * function_setting(function, "Timeout")
        assert queue["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": ["StatusDLQ", "Arn"]},
                                          "maxReceiveCount": 5}


@pytest.mark.parametrize(
    ("function", "expression_parameter", "event_file"),
    [
        ("RepullDailyFunction", "RepullSchedule", "schedule_repull.json"),
        ("SweepFunction", "SweepSchedule", "schedule_sweep.json"),
        ("RefreshEcrCredentialsFunction", "CredentialRefreshSchedule", "schedule_refresh_credentials.json"),
    ],
)
def test_schedules_retry_dead_letter_and_send_the_sample_event_shape(
    function: str, expression_parameter: str, event_file: str
) -> None:
    [(_, _, schedule)] = [e for e in events_of("ScheduleV2") if e[0] == function]
    assert schedule["ScheduleExpression"] == {"Ref": expression_parameter}
    assert schedule["OmitName"] is True, "a fixed schedule name clashes between two stacks in one account"
    assert set(schedule["RetryPolicy"]) == {"MaximumRetryAttempts", "MaximumEventAgeInSeconds"}
    assert getatt_target(schedule["DeadLetterConfig"]["Arn"]) == "ScheduleDLQ"
    # The Input's context placeholders are what Scheduler fills in; the sample has the same fields.
    sent = json.loads(schedule["Input"])
    sample = json.loads((EVENTS / event_file).read_text())
    assert sample.keys() == sent.keys()
    assert sample["schedule"] == sent["schedule"] == Path(props(function)["CodeUri"]).name
    assert all(v.startswith("<aws.scheduler.") for k, v in sent.items() if k != "schedule")


def test_schedule_defaults() -> None:
    parameters = template()["Parameters"]
    assert parameters["RepullSchedule"]["Default"] == "cron(0 3 * * ? *)"
    assert parameters["SweepSchedule"]["Default"] == "rate(1 minute)"
    assert parameters["CredentialRefreshSchedule"]["Default"] == "rate(1 hour)"


def test_the_sweep_bounds_on_silent_and_agentless_nodes_are_parameters_its_settings_read() -> None:
    from prewarm.settings import Settings

    parameters = template()["Parameters"]
    env = props("SweepFunction")["Environment"]["Variables"]
    values = {}
    for variable, parameter in (("AGENT_SILENCE_SECONDS", "AgentSilenceSeconds"),
                                ("NO_AGENT_GRACE_SECONDS", "NoAgentGraceSeconds")):
        assert env[variable] == {"Ref": parameter}
        assert parameters[parameter]["Default"] == 120
        values[variable] = str(parameters[parameter]["Default"])
    settings = Settings.from_env({"TABLE_NAME": "jobs", **values})
    assert (settings.agent_silence_seconds, settings.no_agent_grace_seconds) == (120, 120)
    floor = Settings.model_fields["agent_silence_seconds"].metadata[0].ge
    assert floor == parameters["AgentSilenceSeconds"]["MinValue"]


def test_the_image_removal_grace_reaches_both_functions_that_release_images_within_the_settings_bounds() -> None:
    from prewarm.settings import Settings

    parameter = template()["Parameters"]["ImageRemovalGraceSeconds"]
    # dispatch_job releases a deleted job's images, the sweep an expired or superseded job's
    for function in ("DispatchJobFunction", "SweepFunction"):
        variables = props(function)["Environment"]["Variables"]
        assert variables["IMAGE_REMOVAL_GRACE_SECONDS"] == {"Ref": "ImageRemovalGraceSeconds"}, function
    field = Settings.model_fields["image_removal_grace_seconds"]
    bounds = {type(m).__name__: m for m in field.metadata}
    assert (field.default, bounds["Ge"].ge, bounds["Le"].le) == (
        parameter["Default"], parameter["MinValue"], parameter["MaxValue"])
    assert Settings.from_env({"TABLE_NAME": "jobs", "IMAGE_REMOVAL_GRACE_SECONDS": "-1"}).image_removal_grace is None


def test_asynchronous_functions_send_failed_invocations_to_a_dead_letter_queue() -> None:
    for name in ("OnImagePushFunction", "RepullDailyFunction", "SweepFunction", "RefreshEcrCredentialsFunction"):
        on_failure = props(name)["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]
        assert on_failure["Type"] == "SQS"
        assert getatt_target(on_failure["Destination"]) in {"ImagePushDLQ", "ScheduleDLQ"}, name


# -- state ------------------------------------------------------------------------------------


def test_jobs_table_matches_the_documented_design_and_is_retained() -> None:
    table = resources()["JobsTable"]
    p = table["Properties"]
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    assert p["BillingMode"] == "PAY_PER_REQUEST"
    assert p["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]
    attributes = {a["AttributeName"]: a["AttributeType"] for a in p["AttributeDefinitions"]}
    assert attributes == {"pk": "S", "sk": "S", "kind": "S", "wpk": "S", "running": "S", "fpk": "S", "ipk": "S"}
    indexes = {
        i["IndexName"]: (
            [(k["AttributeName"], k["KeyType"]) for k in i["KeySchema"]],
            i["Projection"]["ProjectionType"],
        )
        for i in p["GlobalSecondaryIndexes"]
    }
    assert indexes == {
        # keys only: job counter updates never write it
        "kinds": ([("kind", "HASH"), ("pk", "RANGE")], "KEYS_ONLY"),
        # sparse: only node items waiting for a parallelism slot carry wpk
        "waiting": ([("wpk", "HASH"), ("sk", "RANGE")], "KEYS_ONLY"),
        # sparse: only running jobs carry running (what a hello reads)
        "running": ([("running", "HASH"), ("pk", "RANGE")], "KEYS_ONLY"),
        # sparse: only node items in flight carry fpk (what the sweep reads for silence)
        "flight": ([("fpk", "HASH"), ("sk", "RANGE")], "KEYS_ONLY"),
        # sparse: only live ImagePullJobs carry ipk, their cluster and repository (what a release reads)
        "images": ([("ipk", "HASH"), ("pk", "RANGE")], "KEYS_ONLY"),
    }
    assert p["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert p["SSESpecification"] == {"SSEEnabled": True}
    assert p["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    assert p["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}


def test_every_queue_is_encrypted_and_dead_letter_queues_keep_messages_14_days() -> None:
    for name, queue in resources("AWS::SQS::Queue").items():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True, name
        if name.endswith("DLQ"):
            assert queue["Properties"]["MessageRetentionPeriod"] == 14 * 24 * 3600, name


def test_status_queue_refuses_plain_http() -> None:
    policies = resources("AWS::SQS::QueuePolicy").values()
    [policy] = [p for p in policies if p["Properties"]["Queues"] == [{"Ref": "StatusQueue"}]]
    deny = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert [s["Condition"] for s in deny] == [{"Bool": {"aws:SecureTransport": "false"}}]


# -- environment ------------------------------------------------------------------------------


def test_every_function_gets_the_settings_it_needs_from_globals() -> None:
    env = globals_env()
    wanted = {"TABLE_NAME", "STATUS_QUEUE_URL", "NODE_QUEUE_PREFIX", "NODE_DLQ_ARN", "SECRET_PREFIX", "CLUSTER_NAME",
              "KUBE_API_ENDPOINT", "KUBE_CA_DATA", "NODE_QUEUE_SENDER_ARNS", "POWERTOOLS_SERVICE_NAME"}
    assert wanted <= env.keys()
    required = {settings_alias(f) for f, info in Settings.model_fields.items() if info.is_required()}
    assert required <= env.keys()
    known = {settings_alias(f) for f in Settings.model_fields}
    assert {"TABLE_NAME", "NODE_QUEUE_PREFIX", "SECRET_PREFIX", "KUBE_CA_DATA"} <= known


def test_node_queue_prefix_parameter_accepts_only_the_sqs_alphabet() -> None:
    pattern = re.compile(template()["Parameters"]["NodeQueuePrefix"]["AllowedPattern"])
    settings_pattern = Settings.model_fields["node_queue_prefix"].metadata[0].pattern
    for prefix in ("prewarm", "team_a-prod", ""):
        assert pattern.fullmatch(prefix)
    for prefix in ("prewarm.prod", "a/b", "name with space"):
        assert not pattern.fullmatch(prefix)
        assert not re.fullmatch(settings_pattern, prefix)


def test_node_queue_senders_are_exactly_the_roles_allowed_to_send_to_node_queues() -> None:
    # Given the roles whose policies may send to the node queues
    node_queues = _node_queue_arn()
    senders = {
        owner
        for owner, s in statements()
        if "sqs:SendMessage" in as_list(s["Action"]) and node_queues in as_list(s["Resource"])
    }
    # Then NODE_QUEUE_SENDER_ARNS (written into each node queue's Policy) names those roles and nothing else:
    # not the agents' role, or a compromised node could put tasks on every node's queue
    listed = globals_env()["NODE_QUEUE_SENDER_ARNS"]["Fn::Join"][1]
    assert [getatt_target(v) for v in listed] == [getatt_target(v) for v in listed if getatt_target(v)]
    assert {getatt_target(v) for v in listed} == senders


# -- IAM --------------------------------------------------------------------------------------

# Actions with no resource type: IAM only accepts "*" for them.
STAR_RESOURCE_ACTIONS = {
    "ecr:GetAuthorizationToken": "returns a registry token; the pulls it allows are scoped by ecr:BatchGetImage",
    "ecr-public:GetAuthorizationToken": "ECR Public token API has no resource type",
    "sts:GetServiceBearerToken": "required alongside ecr-public:GetAuthorizationToken",
    "sqs:ListQueues": "list action; sweep filters by the node queue prefix",
    "secretsmanager:ListSecrets": "list action with no resource type; sweep filters by the pull-secret prefix",
    "xray:PutTraceSegments": "X-Ray write APIs have no resource type",
    "xray:PutTelemetryRecords": "X-Ray write APIs have no resource type",
    "xray:GetSamplingRules": "X-Ray sampling APIs have no resource type",
    "xray:GetSamplingTargets": "X-Ray sampling APIs have no resource type",
    "ec2:DescribeInstances": "EC2 Describe actions have no resource type; bake_snapshots filters by the stack's tag",
    "ec2:DescribeSnapshots": "EC2 Describe actions have no resource type; bake_snapshots filters by the stack's tag",
    "ec2:DescribeLaunchTemplateVersions": "EC2 Describe actions have no resource type",
    "ecr:DescribeRegistry": "describes the caller's own registry (its replication configuration): no resource type",
    "ec2:DescribeImages": "EC2 Describe actions have no resource type; an EC2NodeClass's amiSelectorTerms",
    "ec2:DescribeSubnets": "EC2 Describe actions have no resource type; an EC2NodeClass's subnetSelectorTerms",
}


def _node_queue_arn() -> dict[str, Any]:
    prefix = globals_env()["NODE_QUEUE_PREFIX"]
    return {"Fn::Sub": ["arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${Prefix}-*", {"Prefix": prefix}]}


def _secret_arn(kind: str) -> dict[str, Any]:
    """The ARNs of one kind of secret under the stack's prefix: `pull-secrets` (mirrors) or `registry` (copies)."""
    prefix = globals_env()["SECRET_PREFIX"]
    return {
        "Fn::Sub": [
            f"arn:${{AWS::Partition}}:secretsmanager:${{AWS::Region}}:${{AWS::AccountId}}:secret:${{Prefix}}/{kind}/*",
            {"Prefix": prefix},
        ]
    }


_ACCOUNT = r"arn:\$\{AWS::Partition\}:(?P<service>[a-z-]+):\$\{AWS::Region\}:\$\{AWS::AccountId\}:"
# What "scoped to this stack" means for each ARN written as a string; anything else must be a
# reference to one of the template's own resources.
# The first group of the stack's id (a UUID): the same for the stack's life, whatever its name's length.
STACK_KEY = {"Fn::Select": [0, {"Fn::Split": [
    "-", {"Fn::Select": [2, {"Fn::Split": ["/", {"Ref": "AWS::StackId"}]}]}]}]}
SCOPED_SUBS = {
    _ACCOUNT + r"repository/\*": "the account's ECR repositories (images to inspect and pull)",
    r"arn:\$\{AWS::Partition\}:ecr:\*:\$\{AWS::AccountId\}:repository/\*":
        "the account's ECR repositories in every region (when PullRepositoryArns is empty): the refresher's "
        "token pulls from whichever registries of the account CredentialsConfig names, the agents from "
        "whichever Region their cluster's jobs name",
    _ACCOUNT + r"cluster/\$\{ClusterName\}": "the one cluster of the stack",
    _ACCOUNT + r"parameter\$\{CredentialsConfigParameter\}": "the one configuration parameter",
    r"\$\{JobsTable\.Arn\}/(index|stream)/\*": "the jobs table's index and stream",
    r"arn:\$\{AWS::Partition\}:scheduler:\$\{AWS::Region\}:\$\{AWS::AccountId\}:schedule/default/"
    r"prewarm-cron-\$\{StackKey\}-\*": "the stack's cron job schedules, by name prefix (the stack's id)",
}


# Statements whose resources are not the stack's by ARN: what a builder launches from (an AMI, the subnets
# and security groups the warm snapshot names, its network interface), none of it made or changed, and
# AWS's public AMI parameters that `resolve:ssm:` reads.
NOT_THE_STACKS = {("BakeSnapshotsRole", "LaunchFrom"), ("BakeSnapshotsRole", "AmiParameters")}
# The condition keys that make an EC2 resource the stack's: its tag as it is made, or as it stands.
STACK_TAG = "prewarm.dev/stack"


def _tagged_as_the_stacks(statement: dict[str, Any]) -> bool:
    equals = statement.get("Condition", {}).get("StringEquals", {})
    return (f"aws:RequestTag/{STACK_TAG}" in equals or f"aws:ResourceTag/{STACK_TAG}" in equals
            or (set(as_list(equals.get("ec2:CreateAction", []))) <= {"RunInstances", "CreateSnapshot"} and
            "ec2:CreateAction" in equals))


def _is_scoped(resource: Any) -> bool:
    if isinstance(resource, dict) and "Fn::If" in resource:
        return all(_is_scoped(r) for branch in branches(resource) for r in as_list(branch))
    if resource in (_node_queue_arn(), _secret_arn("pull-secrets"), _secret_arn("registry"),
                    {"Ref": "CredentialRoleArns"}, {"Ref": "PullRepositoryArns"}):
        return True
    target = getatt_target(resource)
    if target is not None:
        return target in resources()
    if isinstance(resource, dict) and isinstance(resource.get("Fn::Sub"), str):
        return any(re.fullmatch(pattern, resource["Fn::Sub"]) for pattern in SCOPED_SUBS)
    if isinstance(resource, dict) and isinstance(resource.get("Fn::Sub"), list):
        text, names = resource["Fn::Sub"]
        return names == {"StackKey": STACK_KEY} and any(re.fullmatch(pattern, text) for pattern in SCOPED_SUBS)
    return False


def test_no_allow_statement_grants_a_wildcard_action() -> None:
    for owner, s in statements():
        for action in as_list(s["Action"]):
            assert "*" not in action, f"{owner}: {action}"


def test_star_resources_only_for_actions_that_have_no_resource_type() -> None:
    for owner, s in statements():
        if "*" in as_list(s["Resource"]):
            assert as_list(s["Resource"]) == ["*"], owner
            assert set(as_list(s["Action"])) <= STAR_RESOURCE_ACTIONS.keys(), f"{owner}: {s['Action']}"


def test_every_other_statement_is_scoped_to_the_stacks_own_resources() -> None:
    for owner, s in statements():
        if as_list(s["Resource"]) == ["*"] or (owner, s.get("Sid")) in NOT_THE_STACKS or _tagged_as_the_stacks(s):
            continue
        for resource in as_list(s["Resource"]):
            assert _is_scoped(resource), f"{owner} {s.get('Sid')}: {resource}"


def test_every_function_runs_as_its_own_role_and_logs_to_its_own_log_group() -> None:
    roles = [getatt_target(props(name)["Role"]) for name in functions()]
    assert len(set(roles)) == len(roles)
    for name, role in zip(functions(), roles, strict=True):
        assert role in resources("AWS::IAM::Role"), name
        log_group = props(name)["LoggingConfig"]["LogGroup"]["Ref"]
        assert props(log_group)["RetentionInDays"] == {"Ref": "LogRetentionDays"}
        [logs] = [s for owner, s in statements() if owner == role and s.get("Sid") == "Logs"]
        assert logs["Resource"] == {"Fn::GetAtt": [log_group, "Arn"]}


def test_functions_that_call_the_kubernetes_api_join_the_vpc_when_subnets_are_given() -> None:
    vpc_policy = "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"
    for name in functions():
        role = getatt_target(props(name)["Role"]) or ""
        talks_to_cluster = any(
            owner == role and "eks:DescribeCluster" in as_list(s["Action"]) for owner, s in statements()
        )
        if talks_to_cluster:
            assert props(name)["VpcConfig"]["Fn::If"][0] == "HasVpc", name
            conditional = {"Fn::If": ["HasVpc", [{"Fn::Sub": vpc_policy}], {"Ref": "AWS::NoValue"}]}
            assert props(role)["ManagedPolicyArns"] == conditional, role


def _statement(owner: str, sid: str) -> dict[str, Any]:
    [found] = [s for o, s in statements() if o == owner and s.get("Sid") == sid]
    return found


@pytest.mark.parametrize(("owner", "sid"), [("RefreshEcrCredentialsRole", "RegistryPulls"),
                                           ("AgentPolicy", "ImagePulls")])
def test_image_pull_grants_are_the_repositories_given_else_the_accounts_in_every_region(owner: str, sid: str) -> None:
    # The refresher's grant is what the namespace pull secrets it writes may pull; the agents' must reach
    # the Regions of every cluster the stack serves, not the stack's Region only.
    assert template()["Parameters"]["PullRepositoryArns"]["Type"] == "CommaDelimitedList"
    assert _statement(owner, sid)["Resource"] == {"Fn::If": [
        "HasPullRepositoryArns", {"Ref": "PullRepositoryArns"},
        {"Fn::Sub": "arn:${AWS::Partition}:ecr:*:${AWS::AccountId}:repository/*"}]}
    assert template()["Conditions"]["HasPullRepositoryArns"] == {
        "Fn::Not": [{"Fn::Equals": [{"Fn::Join": ["", {"Ref": "PullRepositoryArns"}]}, ""]}]}


def test_the_table_policy_knows_the_stacks_roles_by_their_path_whatever_the_stack_names_length() -> None:
    # CloudFormation cuts a generated role name to IAM's 64 characters, stack name first: a pattern on the
    # name (`role/<stack>-*`) misses the roles of a long stack. The path is the stack's whole name.
    path = {"Fn::Sub": "/prewarm/${AWS::Region}/${AWS::StackName}/"}
    roles = resources("AWS::IAM::Role")
    assert roles and {name: r["Properties"].get("Path") for name, r in roles.items()} == {n: path for n in roles}
    assert all("RoleName" not in r["Properties"] for r in roles.values())
    [deny] = props("JobsTable")["ResourcePolicy"]["Fn::If"][1]["PolicyDocument"]["Statement"]
    assert deny["Condition"] == {"ArnNotLike": {"aws:PrincipalArn": {
        "Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:role/prewarm/${AWS::Region}/${AWS::StackName}/*"}}}


def test_optional_grants_exist_only_when_their_parameter_is_given() -> None:
    role = props("RefreshEcrCredentialsRole")["Policies"][0]["PolicyDocument"]["Statement"]
    conditional = {s["Fn::If"][0]: s["Fn::If"][1]["Action"] for s in role if "Fn::If" in s}
    assert conditional == {"HasCredentialRoles": "sts:AssumeRole", "HasCredentialsConfigParameter": "ssm:GetParameter"}


# -- alarms and outputs -----------------------------------------------------------------------


def _dead_letter_queues() -> set[str]:
    """Queues that something dead-letters into, found from the references (not from names)."""
    found: set[str] = {getatt_target(globals_env()["NODE_DLQ_ARN"]) or ""}
    for queue in resources("AWS::SQS::Queue").values():
        if "RedrivePolicy" in queue["Properties"]:
            found.add(getatt_target(queue["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]) or "")
    for _, _, event in (e for kind in ("EventBridgeRule", "ScheduleV2", "DynamoDB") for e in events_of(kind)):
        if "DeadLetterConfig" in event:
            found.add(getatt_target(event["DeadLetterConfig"]["Arn"]) or "")
        if "DestinationConfig" in event:
            found.add(getatt_target(event["DestinationConfig"]["OnFailure"]["Destination"]) or "")
    for name in functions():
        if "EventInvokeConfig" in props(name):
            on_failure = props(name)["EventInvokeConfig"]["DestinationConfig"]["OnFailure"]
            found.add(getatt_target(on_failure["Destination"]) or "")
    return found


def _alarms_on(namespace: str, metric: str) -> dict[str, dict[str, Any]]:
    return {
        name: a["Properties"]
        for name, a in resources("AWS::CloudWatch::Alarm").items()
        if a["Properties"].get("Namespace") == namespace and a["Properties"].get("MetricName") == metric
    }


def test_every_dead_letter_queue_alarms_on_its_first_message() -> None:
    dlqs = _dead_letter_queues()
    assert dlqs == {n for n in resources("AWS::SQS::Queue") if n.endswith("DLQ")}
    alarmed = {}
    for alarm in _alarms_on("AWS/SQS", "ApproximateNumberOfMessagesVisible").values():
        [dimension] = alarm["Dimensions"]
        alarmed[getatt_target(dimension["Value"])] = (alarm["ComparisonOperator"], alarm["Threshold"])
    assert {q: alarmed.get(q) for q in dlqs} == {q: ("GreaterThanThreshold", 0) for q in dlqs}


def test_every_function_alarms_on_errors_over_five_minutes() -> None:
    alarmed = {}
    for alarm in _alarms_on("AWS/Lambda", "Errors").values():
        [dimension] = alarm["Dimensions"]
        alarmed[dimension["Value"]["Ref"]] = (alarm["Period"], alarm["ComparisonOperator"], alarm["Threshold"])
    assert alarmed == {name: (300, "GreaterThanThreshold", 0) for name in functions()}


def test_every_function_alarms_on_its_first_throttle() -> None:
    alarmed = {}
    for alarm in _alarms_on("AWS/Lambda", "Throttles").values():
        [dimension] = alarm["Dimensions"]
        alarmed[dimension["Value"]["Ref"]] = (alarm["Statistic"], alarm["ComparisonOperator"], alarm["Threshold"])
    assert alarmed == {name: ("Sum", "GreaterThanThreshold", 0) for name in functions()}


def test_the_job_stream_alarms_when_dispatch_job_falls_two_minutes_behind() -> None:
    [alarm] = _alarms_on("AWS/Lambda", "IteratorAge").values()
    function = "DispatchJobFunction"  # bake_snapshots' records wait on nothing a person waits on
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": function}}]
    assert (alarm["Statistic"], alarm["ComparisonOperator"], alarm["Threshold"]) == (
        "Maximum", "GreaterThanThreshold", 120000)  # milliseconds
    assert alarm["Period"] * alarm["EvaluationPeriods"] <= 300


def test_the_jobs_table_alarms_on_read_and_write_throttling() -> None:
    for metric in ("ReadThrottleEvents", "WriteThrottleEvents"):
        [alarm] = _alarms_on("AWS/DynamoDB", metric).values()
        assert alarm["Dimensions"] == [{"Name": "TableName", "Value": {"Ref": "JobsTable"}}], metric
        assert (alarm["Statistic"], alarm["ComparisonOperator"], alarm["Threshold"]) == (
            "Sum", "GreaterThanThreshold", 0), metric


def test_credential_expiry_alarms_two_hours_ahead_on_the_refreshers_metric() -> None:
    [alarm] = _alarms_on("Prewarm", "SecondsToEarliestExpiry").values()
    service = props("RefreshEcrCredentialsFunction")["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"]
    assert alarm["Dimensions"] == [{"Name": "service", "Value": service}]
    assert alarm["Statistic"] == "Minimum"
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 7200)


def test_every_alarm_notifies_the_alarm_topic_when_one_is_given() -> None:
    action = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    for name, alarm in resources("AWS::CloudWatch::Alarm").items():
        assert alarm["Properties"]["AlarmActions"] == action, name


def test_dashboard_shows_the_job_metrics_and_every_queue_and_function() -> None:
    body = props("Dashboard")["DashboardBody"]["Fn::Sub"]
    # CloudWatch refuses a body that is not JSON: the dashboard would show nothing
    json.loads(re.sub(r"\$\{[^}]+\}", "x", body))
    for metric in ("JobsStarted", "JobsCompleted", "JobsFailed", "NodePullSeconds", "NodesSucceeded", "NodesFailed"):
        assert f'MetricName=\\"{metric}\\"' in body, metric
    for name in [*_dead_letter_queues(), *functions()]:
        assert f"${{{name}" in body, name
    for stat in ("'p50'", "'p90'", "'Maximum'"):
        assert stat in body


def test_outputs_give_agents_and_operators_what_they_need() -> None:
    outputs = template()["Outputs"]
    wanted = {"JobsTableName", "StatusQueueUrl", "StatusQueueArn", "NodeQueuePrefix", "NodeDLQArn", "SecretPrefix",
              "AgentPolicyArn"} | {f"{name}Name" for name in functions()}
    assert wanted <= outputs.keys()
    env = globals_env()
    assert outputs["NodeQueuePrefix"]["Value"] == env["NODE_QUEUE_PREFIX"]
    assert outputs["SecretPrefix"]["Value"] == env["SECRET_PREFIX"]


def test_the_stack_says_the_package_version_it_is_built_from() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    t = template()
    assert t["Globals"]["Function"]["Environment"]["Variables"]["PREWARM_VERSION"] == version
    assert t["Outputs"]["PrewarmVersion"]["Value"] == version


def test_the_status_redelivery_cap_is_the_status_queues_visibility_timeout() -> None:
    from prewarm.domain.retry import STATUS_QUEUE_VISIBILITY_SECONDS

    assert template()["Resources"]["StatusQueue"]["Properties"]["VisibilityTimeout"] == STATUS_QUEUE_VISIBILITY_SECONDS

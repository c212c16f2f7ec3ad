"""The SAM application of `template.yaml`, deployed onto a moto server and run in this process.

`LocalStack.deploy()` creates the template's tables and queues with their real properties, resolves
every function's environment as CloudFormation would, and binds each function's events to its
handler: SQS event sources (batch size, partial batch failures, DLQ redrive by the queue), the table
stream (filter criteria, retries, on-failure destination), EventBridge rules (pattern, retries, DLQ)
and schedules (a timer for `rate(...)`, `fire()` on demand for any). Handlers run in-process with a
Lambda-like context. A wiring mistake in the template (a handler that does not exist, an event
source pointing nowhere, an environment the settings reject) fails `deploy()`.

Each function runs as its role: its invocations sign with the role's own access key, which the AWS
limits layer maps to the role's ARN and its identity policies from the template (`roles`), so a call the
role is not granted is refused as on AWS, and so is one a resource policy denies. The stack's own
plumbing (event source polling, failure destinations) signs as the operator.

Not emulated: X-Ray, CloudWatch alarms and dashboards, and the template's queue policies.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO, cast

import boto3

from prewarm_devtools.project import project_files
from prewarm_devtools.sam.aws import ACCOUNT, LocalIdentity, patched_environ
from prewarm_devtools.sam.events import LambdaContext, matches_pattern, schedule_event, sqs_event, stream_event
from prewarm_devtools.sam.intrinsics import Physical, Resolver
from prewarm_devtools.sam.roles import Document, policy_document, role_policies
from prewarm_devtools.sam.template import TemplateError, load_template, table_create_args

log = logging.getLogger(__name__)

# Created only as names locally: their effect (permissions, alarms, logs) is not emulated.
_NAME_ONLY = {
    "AWS::IAM::Role": "arn:aws:iam::{account}:role/{name}",
    "AWS::IAM::ManagedPolicy": "arn:aws:iam::{account}:policy/{name}",
    "AWS::Logs::LogGroup": "arn:aws:logs:{region}:{account}:log-group:{name}",
    "AWS::CloudWatch::Alarm": "arn:aws:cloudwatch:{region}:{account}:alarm:{name}",
    "AWS::CloudWatch::Dashboard": "arn:aws:cloudwatch::{account}:dashboard/{name}",
    "AWS::SQS::QueuePolicy": "{name}",
    "AWS::Serverless::LayerVersion": "arn:aws:lambda:{region}:{account}:layer:{name}:1",
    "AWS::SNS::Topic": "arn:aws:sns:{region}:{account}:{name}",
    "AWS::IAM::Policy": "{name}",
}


class WiringError(TemplateError):
    """The template's wiring of a function is broken (caught before anything runs)."""


@dataclass
class Function:
    logical_id: str
    name: str
    code_dir: Path
    handler: str
    env: dict[str, str]
    timeout: int
    memory: int
    events: dict[str, dict[str, Any]]
    identity: LocalIdentity | None = None
    module: ModuleType | None = None
    invocations: int = 0
    errors: int = 0


@dataclass
class _StreamCursor:
    iterator: str | None
    pending: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 0


class LocalStack:
    def __init__(
        self,
        endpoint_url: str,
        *,
        template_path: Path | str | None = None,
        parameters: Mapping[str, str] | None = None,
        stack_name: str = "prewarm-local",
        region: str = "us-west-2",
        function_output: TextIO | None = None,
    ) -> None:
        self.endpoint_url = endpoint_url
        # Where handlers' stdout goes (their JSON logs and EMF metrics, CloudWatch Logs in AWS).
        self.function_output = function_output
        self.template = load_template(template_path)
        self.parameters = dict(parameters or {})
        self.stack_name = stack_name
        self.region = region
        session = boto3.session.Session(region_name=region, aws_access_key_id="local", aws_secret_access_key="local")
        self.dynamodb = session.client("dynamodb", endpoint_url=endpoint_url)
        self.streams = session.client("dynamodbstreams", endpoint_url=endpoint_url)
        self.sqs = session.client("sqs", endpoint_url=endpoint_url)
        self.physical: dict[str, Physical] = {}
        self.functions: dict[str, Function] = {}
        self.not_emulated: list[str] = []
        self._pending_entries: list[tuple[str, Mapping[str, Any]]] = []
        self._lock = threading.RLock()
        self._gate = _InvocationGate()
        self._cursors: dict[tuple[str, str], _StreamCursor] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.resolver: Resolver | None = None
        self.event_bus_url = ""
        #: Role ARN → its identity policies, as the template grants them (filled by `deploy`).
        self.role_policies: dict[str, list[Document]] = {}

    # -- deploy -------------------------------------------------------------------------------

    def deploy(self) -> LocalStack:
        import prewarm.bootstrap as bootstrap

        # Handlers build their clients once per process: a stack deployed after another (on another
        # moto server) must not reach the first one's endpoint and table.
        bootstrap.reset()
        self._pending_entries = []
        resources = self.template["Resources"]
        self.resolver = Resolver(
            self.template, parameters=self.parameters, physical=self.physical, stack_name=self.stack_name,
            region=self.region, account=ACCOUNT,
        )
        # Queues first without redrive (DLQs must exist), then tables, then everything named only.
        queues = {k: v for k, v in resources.items() if v["Type"] == "AWS::SQS::Queue"}
        for logical, res in sorted(queues.items(), key=lambda kv: "RedrivePolicy" in kv[1].get("Properties", {})):
            self._create_queue(logical, res.get("Properties", {}))
        # A resource whose Condition is false is not created, as CloudFormation does.
        resources = {k: v for k, v in resources.items()
                     if "Condition" not in v or self.resolver.condition(v["Condition"])}
        for logical, res in resources.items():
            kind = res["Type"]
            if kind == "AWS::EKS::AccessEntry":
                self._access_entry(logical, res.get("Properties", {}))
            elif kind == "AWS::DynamoDB::Table":
                self._create_table(logical)
            elif kind in _NAME_ONLY:
                name = f"{self.stack_name}-{logical}"
                arn = _NAME_ONLY[kind].format(account=ACCOUNT, region=self.region, name=name)
                self.physical[logical] = Physical(ref=arn if kind.endswith("ManagedPolicy") else name,
                                                  attrs={"Arn": arn})
                self.not_emulated.append(f"{logical} ({kind})")
            elif kind == "AWS::Serverless::Function":
                name = f"{self.stack_name}-{logical}"
                arn = f"arn:aws:lambda:{self.region}:{ACCOUNT}:function:{name}"
                self.physical[logical] = Physical(ref=name, attrs={"Arn": arn})
        for logical, res in resources.items():
            if res["Type"] == "AWS::Serverless::Function":
                self.functions[logical] = self._function(logical, res.get("Properties", {}))
        self.role_policies = role_policies(self.resolver)
        for fn in self.functions.values():
            self._check_wiring(fn)
            if fn.identity is not None:
                # A role the template does not define (given as a parameter) has policies unknown here.
                fn.identity.register(self.role_policies.get(fn.identity.arn))
        # Local stand-in for EventBridge's bus: other processes (`prewarm local push`) drop events here.
        self.event_bus_url = self.sqs.create_queue(QueueName=f"{self.stack_name}-local-event-bus")["QueueUrl"]
        return self

    def _access_entry(self, logical: str, props: Mapping[str, Any]) -> None:
        # Resolved after the roles exist; the embedded Kubernetes API holds the entries (moto has no EKS
        # access entries), so `access_entries` is what local mode hands it.
        self._pending_entries.append((logical, props))

    def access_entries(self) -> dict[str, tuple[str, ...]]:
        """The template's EKS access entries: principal ARN → Kubernetes groups."""
        assert self.resolver is not None
        entries = {}
        for logical, props in self._pending_entries:
            resolved = self.resolver.resolve(dict(props))
            if resolved.get("Type", "STANDARD") != "STANDARD" or resolved.get("AccessPolicies"):
                raise TemplateError(f"{logical}: local mode models STANDARD access entries without access policies")
            entries[str(resolved["PrincipalArn"])] = tuple(resolved.get("KubernetesGroups") or ())
        return entries

    def policy_document(self, logical: str) -> Document:
        """The resolved document of the template's managed policy `logical` (`AgentPolicy`: the agents')."""
        assert self.resolver is not None
        return policy_document(self.resolver, logical)

    def outputs(self) -> dict[str, str]:
        """The template's Outputs as CloudFormation reports them (those whose Condition holds)."""
        assert self.resolver is not None
        found = {}
        for key, spec in self.template.get("Outputs", {}).items():
            if "Condition" in spec and not self.resolver.condition(spec["Condition"]):
                continue
            found[key] = str(self.resolver.resolve(spec["Value"]))
        return found

    def _create_queue(self, logical: str, props: Mapping[str, Any]) -> None:
        assert self.resolver is not None
        resolved = self.resolver.resolve(dict(props))
        name = resolved.pop("QueueName", None) or f"{self.stack_name}-{logical}"
        attrs: dict[str, str] = {}
        for key in ("VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds", "ReceiveMessageWaitTimeSeconds",
                    "MaximumMessageSize", "SqsManagedSseEnabled"):
            if key in resolved:
                attrs[key] = str(resolved[key]).lower() if isinstance(resolved[key], bool) else str(resolved[key])
        if "RedrivePolicy" in resolved:
            policy = resolved["RedrivePolicy"]
            attrs["RedrivePolicy"] = json.dumps({
                "deadLetterTargetArn": policy["deadLetterTargetArn"],
                "maxReceiveCount": str(policy["maxReceiveCount"]),
            })
        url = self.sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        self.physical[logical] = Physical(ref=url, attrs={"Arn": arn, "QueueName": name, "QueueUrl": url})

    def _create_table(self, logical: str) -> None:
        assert self.resolver is not None
        name = f"{self.stack_name}-{logical}"
        args = table_create_args(self.template, name, logical)
        self.dynamodb.create_table(**args)
        self.dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.05, "MaxAttempts": 200})
        table = self.dynamodb.describe_table(TableName=name)["Table"]
        policy = self.resolver.resolve(dict(self.template["Resources"][logical]["Properties"])).get("ResourcePolicy")
        if policy:
            # moto keeps it; the AWS limits layer evaluates its Deny statements for each caller.
            self.dynamodb.put_resource_policy(ResourceArn=table["TableArn"],
                                              Policy=json.dumps(policy["PolicyDocument"]))
        attrs = {"Arn": table["TableArn"]}
        if table.get("LatestStreamArn"):
            attrs["StreamArn"] = table["LatestStreamArn"]
        self.physical[logical] = Physical(ref=name, attrs=attrs)

    def _function(self, logical: str, props: Mapping[str, Any]) -> Function:
        assert self.resolver is not None
        globals_ = self.template.get("Globals", {}).get("Function", {})
        env_spec = {**globals_.get("Environment", {}).get("Variables", {}),
                    **props.get("Environment", {}).get("Variables", {})}
        env = {k: str(v) for k, v in self.resolver.resolve(env_spec).items()}
        code_uri = props.get("CodeUri") or globals_.get("CodeUri")
        handler = props.get("Handler") or globals_.get("Handler")
        if not code_uri or not handler:
            raise WiringError(f"{logical}: CodeUri and Handler are required")
        return Function(
            logical_id=logical,
            name=env.get("POWERTOOLS_SERVICE_NAME", logical),
            code_dir=project_files().root / str(code_uri),
            handler=str(handler),
            env=env,
            timeout=int(props.get("Timeout", globals_.get("Timeout", 3))),
            memory=int(props.get("MemorySize", globals_.get("MemorySize", 128))),
            events={k: self.resolver.resolve(v) for k, v in props.get("Events", {}).items()},
            # SAM makes `<Function>Role` for a function that names no Role.
            identity=LocalIdentity.of_role(str(self.resolver.resolve(props["Role"])) if "Role" in props
                                           else f"arn:aws:iam::{ACCOUNT}:role/{self.stack_name}-{logical}Role"),
        )

    def _check_wiring(self, fn: Function) -> None:
        module_file, _, attr = fn.handler.rpartition(".")
        path = fn.code_dir / f"{module_file}.py"
        if not path.is_file():
            raise WiringError(f"{fn.logical_id}: handler file {_shown(path)} does not exist")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.FunctionDef) and n.name == attr for n in tree.body):
            raise WiringError(f"{fn.logical_id}: {_shown(path)} defines no function {attr}")
        for name, event in fn.events.items():
            kind, props = event.get("Type"), event.get("Properties", {})
            where = f"{fn.logical_id} event {name}"
            if kind == "SQS":
                self._queue_by_arn(props.get("Queue", ""), where)
            elif kind == "DynamoDB":
                if props.get("Stream") not in {p.attrs.get("StreamArn") for p in self.physical.values()}:
                    raise WiringError(f"{where}: Stream {props.get('Stream')!r} is no table stream of this template")
                for f in props.get("FilterCriteria", {}).get("Filters", []):
                    try:
                        json.loads(f["Pattern"])
                    except (KeyError, ValueError) as e:
                        raise WiringError(f"{where}: filter pattern is not JSON: {e}") from e
            elif kind == "EventBridgeRule":
                if not isinstance(props.get("Pattern"), dict):
                    raise WiringError(f"{where}: Pattern must be an object")
            elif kind in ("Schedule", "ScheduleV2"):
                parse_schedule(str(props.get("ScheduleExpression") or props.get("Schedule", "")), where)
            else:
                raise WiringError(f"{where}: event type {kind!r} is not supported locally")
        from prewarm.settings import Settings

        Settings.from_env(fn.env)  # a function whose environment the settings reject fails here

    def _queue_by_arn(self, arn: str, where: str) -> Physical:
        for p in self.physical.values():
            if p.attrs.get("Arn") == arn and "QueueUrl" in p.attrs:
                return p
        raise WiringError(f"{where}: queue {arn!r} is not a queue of this template")

    # -- invoking ------------------------------------------------------------------------------

    def function(self, name: str) -> Function:
        for fn in self.functions.values():
            if name in (fn.logical_id, fn.name, fn.code_dir.name):
                return fn
        raise KeyError(f"no function {name!r}; have {sorted(f.code_dir.name for f in self.functions.values())}")

    def invoke(self, name: str, event: Mapping[str, Any]) -> Any:
        """Runs a handler in-process with its own environment.

        Invocations of one function may overlap, as Lambda runs concurrent batches of one event source
        in separate environments; those of different functions take turns, since this process has one
        `os.environ` and one stdout for all of them.
        """
        fn = self.function(name)
        env = {**fn.env, **(fn.identity.environment() if fn.identity else {})}
        if "AWS_ENDPOINT_URL" not in os.environ:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
        inside = getattr(_invocation, "active", False)
        _invocation.active = True  # what this thread prints now is the function's output
        try:
            with self._gate.enter(fn.logical_id, lambda: self._environment(fn, env)):
                attr = fn.handler.rpartition(".")[2]
                context = LambdaContext(f"{self.stack_name}-{fn.logical_id}", self.region, ACCOUNT, fn.memory,
                                        fn.timeout)
                with self._lock:
                    fn.invocations += 1
                try:
                    return getattr(fn.module, attr)(dict(event), context)
                except Exception:
                    with self._lock:
                        fn.errors += 1
                    raise
        finally:
            _invocation.active = inside

    def signing_as(self, identity: LocalIdentity) -> contextlib.AbstractContextManager[None]:
        """A block in which boto3 clients built in this process sign as `identity` (an agent in this
        process, which builds its clients from the environment): it waits for the functions running
        now, each of which sets its own role's keys, and holds the next ones off until it ends."""
        return self._gate.enter(f"principal {identity.arn}", lambda: patched_environ(identity.environment()))

    @contextlib.contextmanager
    def _environment(self, fn: Function, env: Mapping[str, str]) -> Iterator[None]:
        """What the first of a function's overlapping invocations sets up and the last one takes down."""
        routed = _RoutedStdout(sys.stdout, self.function_output or sys.stdout)
        with patched_environ(env), contextlib.redirect_stdout(cast(TextIO, routed)):
            from prewarm.settings import settings

            settings.cache_clear()
            # The shared package's clients sign with the keys in force when they were built: a
            # function's own, as in its own Lambda environment, not those of the last function or of
            # whatever else in this process built them meanwhile.
            import prewarm.bootstrap as bootstrap

            bootstrap.reset()
            # boto3's default session keeps the credentials it resolved first: start a new one.
            boto3.DEFAULT_SESSION = None
            if fn.module is None:
                # Loaded under the redirect, so loggers created at import write there too.
                fn.module = self._load(fn)
            _name_the_service(fn.env.get("POWERTOOLS_SERVICE_NAME", fn.name))
            with _logs_to(sys.stdout):
                yield

    @staticmethod
    def _load(fn: Function) -> ModuleType:
        module_file = fn.handler.rpartition(".")[0]
        path = fn.code_dir / f"{module_file}.py"
        spec = importlib.util.spec_from_file_location(f"prewarm_function_{fn.code_dir.name}", path)
        if spec is None or spec.loader is None:
            raise WiringError(f"{fn.logical_id}: cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    # -- event sources -------------------------------------------------------------------------

    def bindings(self, kind: str) -> list[tuple[Function, str, dict[str, Any]]]:
        return [
            (fn, name, ev.get("Properties", {}))
            for fn in self.functions.values()
            for name, ev in fn.events.items()
            if ev.get("Type") == kind or (kind == "Schedule" and ev.get("Type") == "ScheduleV2")
        ]

    def put_event(self, event: Mapping[str, Any]) -> list[Any]:
        """Delivers an EventBridge event to every matching rule's function, with the rule's retries and DLQ."""
        results = []
        for fn, _name, props in self.bindings("EventBridgeRule"):
            if not matches_pattern(props["Pattern"], event):
                continue
            attempts = 1 + int(props.get("RetryPolicy", {}).get("MaximumRetryAttempts", 185))
            for attempt in range(attempts):
                try:
                    results.append(self.invoke(fn.logical_id, event))
                    break
                except Exception as e:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
                    log.warning("%s failed on attempt %d: %s", fn.name, attempt + 1, e)
            else:
                dlq = props.get("DeadLetterConfig", {}).get("Arn")
                if dlq:
                    self.sqs.send_message(QueueUrl=self._queue_by_arn(dlq, fn.logical_id).ref,
                                          MessageBody=json.dumps(event))
        return results

    def fire(self, name: str, payload: Any = None) -> Any:
        """Fires a function's schedule now (moto's schedules never fire)."""
        fn = self.function(name)
        for ev_name, ev in fn.events.items():
            if ev.get("Type") in ("Schedule", "ScheduleV2"):
                arn = f"arn:aws:scheduler:{self.region}:{ACCOUNT}:schedule/default/{fn.logical_id}-{ev_name}"
                return self.invoke(fn.logical_id, schedule_event(arn, self.region, ACCOUNT, payload))
        raise KeyError(f"{name} has no schedule")

    def pump_event_bus(self) -> int:
        """Delivers the events other processes put on the local event bus (see `put_event`)."""
        if not self.event_bus_url:
            return 0
        got = self.sqs.receive_message(QueueUrl=self.event_bus_url, MaxNumberOfMessages=10,
                                       WaitTimeSeconds=0).get("Messages", [])
        for m in got:
            try:
                event = json.loads(m["Body"])
            except json.JSONDecodeError:
                log.warning("dropped a local event bus message that is not JSON")
            else:
                self.put_event(event)
            self.sqs.delete_message(QueueUrl=self.event_bus_url, ReceiptHandle=m["ReceiptHandle"])
        return len(got)

    def pump_sqs(self) -> int:
        """Delivers batches from each SQS event source; returns how many messages were handled.

        As Lambda's event source mapping: a batch gathers up to `BatchSize` messages (10 per receive),
        and up to `ScalingConfig.MaximumConcurrency` batches are in flight at once. Locally a batch
        takes what the queue holds now instead of waiting out `MaximumBatchingWindowInSeconds`, so at
        low traffic AWS adds up to that window of latency that local mode does not.
        """
        handled = 0
        for fn, _name, props in self.bindings("SQS"):
            queue = self._queue_by_arn(props["Queue"], fn.logical_id)
            size = int(props.get("BatchSize", 10))
            in_flight = max(1, int(props.get("ScalingConfig", {}).get("MaximumConcurrency", 1)))
            batches = []
            for _ in range(in_flight):
                batch = self._gather(queue.ref, size)
                if not batch:
                    break
                batches.append(batch)
            if not batches:
                continue
            handled += sum(len(b) for b in batches)
            if len(batches) == 1:
                self._deliver_sqs_batch(fn, props, queue.ref, batches[0])
                continue
            with ThreadPoolExecutor(len(batches), thread_name_prefix=f"esm-{fn.name}") as pool:
                futures = [pool.submit(self._deliver_sqs_batch, fn, props, queue.ref, b) for b in batches]
                for future in futures:
                    future.result()
        return handled

    def _gather(self, queue_url: str, size: int) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        while len(batch) < size:
            got = self.sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=min(size - len(batch), 10), WaitTimeSeconds=0,
                AttributeNames=["All"],
            ).get("Messages", [])
            if not got:
                break
            batch += got
        return batch

    def _deliver_sqs_batch(self, fn: Function, props: Mapping[str, Any], queue_url: str,
                           got: list[dict[str, Any]]) -> None:
        # As Lambda's mapping: the handled messages are deleted; the failed ones are left as they are,
        # to come back when their visibility runs out: the queue's own timeout from the receive, or what
        # the function set with ChangeMessageVisibility ("Handling errors for an SQS event source in
        # Lambda"). Nothing here shortens it.
        failed: set[str] = {m["MessageId"] for m in got}
        try:
            response = self.invoke(fn.logical_id, sqs_event(got, props["Queue"], self.region))
            if "ReportBatchItemFailures" in props.get("FunctionResponseTypes", []):
                failed = {f["itemIdentifier"] for f in (response or {}).get("batchItemFailures", [])}
            else:
                failed = set()
        except Exception as e:  # noqa: BLE001 - the batch returns to the queue, as Lambda does
            log.warning("%s failed a batch of %d: %s", fn.name, len(got), e)
        done = [m for m in got if m["MessageId"] not in failed]
        for start in range(0, len(done), 10):
            chunk = done[start : start + 10]
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)]
            self.sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)

    def pump_streams(self) -> int:
        """Delivers one batch from each table stream event source; returns how many records were handled."""
        handled = 0
        for fn, name, props in self.bindings("DynamoDB"):
            for shard_id, cursor in self._shards(fn, name, props):
                if not cursor.pending and cursor.iterator:
                    out = self.streams.get_records(ShardIterator=cursor.iterator, Limit=1000)
                    cursor.iterator = out.get("NextShardIterator")
                    filters = [json.loads(f["Pattern"]) for f in props.get("FilterCriteria", {}).get("Filters", [])]
                    cursor.pending = [
                        r for r in out.get("Records", [])
                        if not filters or any(matches_pattern(p, _as_filter_input(r)) for p in filters)
                    ]
                if not cursor.pending:
                    continue
                batch = cursor.pending[: int(props.get("BatchSize", 100))]
                handled += len(batch)
                self._deliver_stream_batch(fn, props, cursor, batch, shard_id)
        return handled

    def _deliver_stream_batch(
        self, fn: Function, props: Mapping[str, Any], cursor: _StreamCursor, batch: list[dict[str, Any]], shard: str
    ) -> None:
        try:
            response = self.invoke(fn.logical_id, stream_event(batch, props["Stream"], self.region))
            failures = [f["itemIdentifier"] for f in (response or {}).get("batchItemFailures", [])]
        except Exception as e:  # noqa: BLE001 - the whole batch is retried, as Lambda does
            log.warning("%s failed a stream batch: %s", fn.name, e)
            failures = [batch[0]["dynamodb"]["SequenceNumber"]]
        if not failures:
            del cursor.pending[: len(batch)]
            cursor.attempts = 0
            return
        first = min(
            (i for i, r in enumerate(batch) if r["dynamodb"]["SequenceNumber"] in failures), default=0
        )
        del cursor.pending[:first]  # checkpoint before the first failed record, retry from it
        cursor.attempts += 1
        if cursor.attempts > int(props.get("MaximumRetryAttempts", -1)) >= 0:
            dropped = cursor.pending.pop(0)
            cursor.attempts = 0
            destination = props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
            if destination:
                self.sqs.send_message(
                    QueueUrl=self._queue_by_arn(destination, fn.logical_id).ref,
                    MessageBody=json.dumps({"requestContext": {"functionArn": fn.logical_id, "condition":
                                            "RetryAttemptsExhausted"}, "DDBStreamBatchInfo": {
                                            "shardId": shard, "startSequenceNumber": dropped["dynamodb"][
                                                "SequenceNumber"]}}),
                )

    def _shards(self, fn: Function, name: str, props: Mapping[str, Any]) -> list[tuple[str, _StreamCursor]]:
        stream = props["Stream"]
        shards = self.streams.describe_stream(StreamArn=stream)["StreamDescription"].get("Shards", [])
        out = []
        for shard in shards:
            key = (f"{fn.logical_id}/{name}", shard["ShardId"])
            if key not in self._cursors:
                it_type = "TRIM_HORIZON" if props.get("StartingPosition") == "TRIM_HORIZON" else "LATEST"
                iterator = self.streams.get_shard_iterator(
                    StreamArn=stream, ShardId=shard["ShardId"], ShardIteratorType=it_type
                )["ShardIterator"]
                self._cursors[key] = _StreamCursor(iterator)
            out.append((shard["ShardId"], self._cursors[key]))
        return out

    def prime_streams(self) -> None:
        """Takes the stream positions now (LATEST means: from here on)."""
        for fn, name, props in self.bindings("DynamoDB"):
            self._shards(fn, name, props)

    def run_until_idle(
        self, timeout: float = 30.0, *, idle_rounds: int = 2, poll: Callable[[], int] | None = None
    ) -> None:
        """Pumps every event source until nothing moves for `idle_rounds` passes (or the timeout)."""
        deadline = time.monotonic() + timeout
        quiet = 0
        while quiet < idle_rounds:
            moved = self.pump_event_bus() + self.pump_streams() + self.pump_sqs() + (poll() if poll else 0)
            quiet = 0 if moved else quiet + 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"local stack still busy after {timeout} s")
            if not moved:
                time.sleep(0.05)

    # -- background mode -----------------------------------------------------------------------

    def start(self, *, schedules: bool = True, interval: float = 0.2) -> None:
        """Runs the event sources (and timers for rate schedules) on a background thread."""
        self.prime_streams()
        self._stop.clear()

        def loop() -> None:
            next_fire = {fn.logical_id: time.monotonic() + period for fn, period in self._rate_schedules()}
            while not self._stop.is_set():
                try:
                    moved = self.pump_event_bus() + self.pump_streams() + self.pump_sqs()
                    now = time.monotonic()
                    if schedules:
                        for fn, period in self._rate_schedules():
                            if now >= next_fire[fn.logical_id]:
                                next_fire[fn.logical_id] = now + period
                                self.fire(fn.logical_id)
                except Exception:  # keep serving; the failure is logged with its traceback
                    log.exception("local stack event loop")
                    moved = 0
                if not moved:
                    self._stop.wait(interval)

        t = threading.Thread(target=loop, name="prewarm-local-stack", daemon=True)
        t.start()
        self._threads.append(t)

    def _rate_schedules(self) -> list[tuple[Function, float]]:
        out = []
        for fn, _name, props in self.bindings("Schedule"):
            period = parse_schedule(str(props.get("ScheduleExpression") or props.get("Schedule", "")), fn.logical_id)
            if period is not None:
                out.append((fn, period))
        return out

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()

    def env(self) -> dict[str, str]:
        """The environment every function shares (table, queues, prefixes) — for the CLI and agents."""
        common = None
        for fn in self.functions.values():
            common = dict(fn.env) if common is None else {k: v for k, v in common.items() if fn.env.get(k) == v}
        return {**(common or {}), **({"LOCAL_EVENT_BUS_URL": self.event_bus_url} if self.event_bus_url else {})}


_RATE = re.compile(r"rate\((\d+)\s+(minute|minutes|hour|hours|day|days)\)")
_CRON = re.compile(r"cron\((\S+\s+){5}\S+\)")


@contextlib.contextmanager
def _logs_to(stream: TextIO) -> Iterator[None]:
    """Points the functions' log handler at this invocation's stdout, then back.

    Its StreamHandler kept the stdout of whatever imported `prewarm.observability` first.
    """
    import prewarm.observability as observability

    handlers = [h for h in observability.logger.handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    before = [h.setStream(stream) for h in handlers]
    try:
        yield
    finally:
        for handler, old in zip(handlers, before, strict=True):
            # A stack's routed stdout ends with that stack (its function log is closed): hand the handler
            # back the real stdout behind it, so no later stack flushes into a closed file.
            while isinstance(old, _RoutedStdout):
                old = old.normal
            if old is not None:
                handler.setStream(old)


class _ServiceAsLoggerName(logging.Filter):
    """Names the functions' own Logger's records after this invocation's service. On AWS its logger is
    named after the one service of the process; here it keeps the name of the function loaded first."""

    service = ""

    def filter(self, record: logging.LogRecord) -> bool:
        record.name = self.service or record.name
        return True


_OWN_LOGGER_NAME = _ServiceAsLoggerName()


def _name_the_service(service: str) -> None:
    """Labels the functions' logs and metrics with this invocation's `POWERTOOLS_SERVICE_NAME`.

    Powertools reads the variable once, when `prewarm.observability` builds its Logger and Metrics. In
    AWS one process runs one function; here every function shares one process, so each invocation
    names its own service (its environment is already in force).
    """
    import prewarm.observability as observability

    observability.logger.service = service
    observability.logger.append_keys(service=service)
    _OWN_LOGGER_NAME.service = service
    own = observability.logger._logger  # the stdlib logger it writes through (Powertools proxies to it)
    if _OWN_LOGGER_NAME not in own.filters:
        own.addFilter(_OWN_LOGGER_NAME)
    provider = getattr(observability.metrics, "provider", None)
    if provider is not None and hasattr(provider, "service"):
        provider.service = service


def _shown(path: Path) -> Path:
    """`path` as the template names it: relative to the project's files when it lies under them."""
    root = project_files().root
    return path.relative_to(root) if path.is_relative_to(root) else path


def parse_schedule(expression: str, where: str) -> float | None:
    """Seconds between runs of a `rate(...)`, None for a valid `cron(...)` (fired on demand locally)."""
    if m := _RATE.fullmatch(expression.strip()):
        unit = {"minute": 60, "hour": 3600, "day": 86400}[m.group(2).rstrip("s")]
        return int(m.group(1)) * unit
    if _CRON.fullmatch(expression.strip()):
        return None
    raise WiringError(f"{where}: schedule expression {expression!r} is neither rate(...) nor cron(...)")


def _as_filter_input(record: Mapping[str, Any]) -> dict[str, Any]:
    return {"eventName": record.get("eventName"), "dynamodb": record.get("dynamodb", {})}


_invocation = threading.local()


class _RoutedStdout:
    """This process's stdout while functions run: what a function's thread writes (its logs, its
    metrics) goes to the functions' output; what any other thread writes (the CLI, the demo's report,
    a benchmark) still reaches the real stdout, whenever it happens to print."""

    def __init__(self, normal: TextIO, functions: TextIO) -> None:
        self.normal, self.functions = normal, functions

    def _target(self) -> TextIO:
        return self.functions if getattr(_invocation, "active", False) else self.normal

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.normal, name)


class _InvocationGate:
    """Lets invocations of one function overlap while keeping different functions apart.

    The first invocation of a function to enter sets up its environment; the last to leave takes it
    down; then another function may enter. An invocation made from inside another (the same thread)
    enters at once.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: str | None = None
        self._inside = 0
        self._setup: contextlib.AbstractContextManager[None] | None = None
        self._local = threading.local()

    @contextlib.contextmanager
    def enter(self, name: str, setup: Callable[[], contextlib.AbstractContextManager[None]]) -> Iterator[None]:
        if getattr(self._local, "depth", 0):
            self._local.depth += 1
            try:
                with setup():
                    yield
            finally:
                self._local.depth -= 1
            return
        with self._cond:
            while self._owner not in (None, name):
                self._cond.wait()
            self._owner = name
            self._inside += 1
            if self._setup is None:
                self._setup = setup()
                try:
                    self._setup.__enter__()
                except BaseException:
                    self._setup, self._owner, self._inside = None, None, 0
                    self._cond.notify_all()
                    raise
        self._local.depth = 1
        try:
            yield
        finally:
            self._local.depth = 0
            with self._cond:
                self._inside -= 1
                if self._inside == 0:
                    setup_done, self._setup, self._owner = self._setup, None, None
                    if setup_done is not None:
                        setup_done.__exit__(None, None, None)
                    self._cond.notify_all()

"""The SAM application of `template.yaml`, deployed onto a moto server and run in this process.

What is deployed is what SAM hands CloudFormation (`sam_transform`, aws-sam-translator): the functions as
SAM generates them (Globals merged in, the role SAM makes for one that names none), each event delivered
as the event source mapping, rule or schedule SAM generates for it configures (the emulator delivers them
itself: they are read, not created on moto).

`LocalStack.deploy()` creates the template's tables and queues with their real properties, resolves
every function's environment as CloudFormation would, and binds each function's events to its
handler: SQS event sources (batch size, partial batch failures, DLQ redrive by the queue), the table
stream (filter criteria, retries, on-failure destination), EventBridge rules (pattern, retries, DLQ)
and schedules (a timer for `rate(...)`, `fire()` on demand for any; the schedules functions create in
moto's Scheduler at their times, `scheduler.LocalScheduler`). Each function runs in an execution
environment of its own (`environments`: a process, as Lambda's) with a Lambda-like context. A wiring
mistake in the template (a handler that does not exist, an event source pointing nowhere, an environment
the settings reject) fails `deploy()`.

Each function runs as its role: its invocations sign with the role's own access key, which the AWS
limits layer maps to the role's ARN and its identity policies from the template (`roles`), so a call the
role is not granted is refused as on AWS, and so is one a resource policy denies. The stack's own
plumbing (event source polling, failure destinations) signs as the operator.

Not emulated: X-Ray, CloudWatch alarms and dashboards, and the template's queue policies.

Here is the deploy and the invoke; how each event source delivers is `event_sources`, where a handler runs
(its process, environment and output) is `environments`.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import sys
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

import boto3

from prewarm_devtools import aws_limits
from prewarm_devtools.project import project_files
from prewarm_devtools.sam.aws import ACCOUNT, LocalIdentity, patched_environ
from prewarm_devtools.sam.environments import Environments, FunctionError
from prewarm_devtools.sam.event_sources import SUPPORTED_EVENTS, EventSources, StreamCursor, parse_schedule
from prewarm_devtools.sam.intrinsics import Physical, Resolver
from prewarm_devtools.sam.invocation import Function, InvocationGate, WiringError, shown
from prewarm_devtools.sam.roles import Document, policy_document, role_policies
from prewarm_devtools.sam.template import (
    TemplateError,
    load_template,
    local_code_path,
    sam_transform,
    table_create_args,
)

# IAM role names stop at 64 characters (IAM User Guide, "IAM and AWS STS quotas").
IAM_NAME_LIMIT = 64


def generated_name(stack: str, logical: str, limit: int) -> str:
    """The name CloudFormation gives a resource that names none: `<stack>-<logical id>`, and when that is
    longer than the resource type allows, cut to fit with a random suffix (here derived from the full name,
    so every process derives the same one): a long stack's role names do not start with its whole name.

    >>> generated_name("pw", "SweepRole", 64)
    'pw-SweepRole'
    >>> len(generated_name("s" * 60, "SweepRole", 64))
    64
    """
    name = f"{stack}-{logical}"
    if len(name) <= limit:
        return name
    suffix = hashlib.sha256(name.encode()).hexdigest()[:12].upper()
    return f"{name[: limit - len(suffix) - 1]}-{suffix}"


# Created only as names locally: their effect (permissions, alarms, logs) is not emulated.
_NAME_ONLY = {
    "AWS::IAM::ManagedPolicy": "arn:aws:iam::{account}:policy/{name}",
    "AWS::Logs::LogGroup": "arn:aws:logs:{region}:{account}:log-group:{name}",
    "AWS::CloudWatch::Alarm": "arn:aws:cloudwatch:{region}:{account}:alarm:{name}",
    "AWS::CloudWatch::Dashboard": "arn:aws:cloudwatch::{account}:dashboard/{name}",
    "AWS::SQS::QueuePolicy": "{name}",
    "AWS::Lambda::LayerVersion": "arn:aws:lambda:{region}:{account}:layer:{name}:1",
    "AWS::SNS::Topic": "arn:aws:sns:{region}:{account}:{name}",
    "AWS::IAM::Policy": "{name}",
    "AWS::IAM::InstanceProfile": "arn:aws:iam::{account}:instance-profile/{name}",
}


class LocalStack(EventSources):
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
        self.environments = Environments(function_output or sys.stdout)
        # A stack dropped without `stop()` ends its functions' processes all the same.
        weakref.finalize(self, self.environments.end)
        self.parameters = dict(parameters or {})
        self.stack_name = stack_name
        self.region = region
        # The template as written, and as SAM hands it to CloudFormation (what the stack deploys); the events
        # of each function are read from the former, as the emulator delivers them itself.
        self.template = load_template(template_path)
        self.cloudformation = sam_transform(self.template, region=region, account=ACCOUNT)
        session = boto3.session.Session(region_name=region, aws_access_key_id="local", aws_secret_access_key="local")
        self.dynamodb = session.client("dynamodb", endpoint_url=endpoint_url)
        self.streams = session.client("dynamodbstreams", endpoint_url=endpoint_url)
        self.sqs = session.client("sqs", endpoint_url=endpoint_url)
        self.scheduler = session.client("scheduler", endpoint_url=endpoint_url)
        self.physical: dict[str, Physical] = {}
        self.functions: dict[str, Function] = {}
        self.not_emulated: list[str] = []
        self._pending_entries: list[tuple[str, Mapping[str, Any]]] = []
        self._lock = threading.RLock()
        self._gate = InvocationGate()
        self._cursors: dict[tuple[str, str], StreamCursor] = {}
        self._threads: list[threading.Thread] = []
        self._pools: list[ThreadPoolExecutor] = []
        self._batches: set[Future[None]] = set()
        self._stop = threading.Event()
        self.resolver: Resolver | None = None
        self.event_bus_url = ""
        #: Role ARN → its identity policies, as the template grants them (filled by `deploy`).
        self.role_policies: dict[str, list[Document]] = {}

    # -- deploy -------------------------------------------------------------------------------

    def deploy(self) -> LocalStack:
        import prewarm.bootstrap as bootstrap

        # What this process builds with the shared package (local mode's own reads) is built once per
        # process: a stack deployed after another (on another moto server) must not reach the first one's.
        bootstrap.reset()
        self._pending_entries = []
        resources = self.cloudformation["Resources"]
        self.resolver = Resolver(
            self.cloudformation, parameters=self.parameters, physical=self.physical, stack_name=self.stack_name,
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
            elif kind == "AWS::IAM::Role":
                path = str(self.resolver.resolve(res.get("Properties", {}).get("Path", "/")))
                name = generated_name(self.stack_name, logical, IAM_NAME_LIMIT)
                arn = f"arn:aws:iam::{ACCOUNT}:role{path}{name}"
                self.physical[logical] = Physical(ref=name, attrs={"Arn": arn})
                self.not_emulated.append(f"{logical} ({kind})")
            elif kind in _NAME_ONLY:
                name = f"{self.stack_name}-{logical}"
                arn = _NAME_ONLY[kind].format(account=ACCOUNT, region=self.region, name=name)
                self.physical[logical] = Physical(ref=arn if kind.endswith("ManagedPolicy") else name,
                                                  attrs={"Arn": arn})
                self.not_emulated.append(f"{logical} ({kind})")
            elif kind == "AWS::Lambda::Function":
                name = f"{self.stack_name}-{logical}"
                arn = f"arn:aws:lambda:{self.region}:{ACCOUNT}:function:{name}"
                self.physical[logical] = Physical(ref=name, attrs={"Arn": arn})
        for logical, res in resources.items():
            if res["Type"] == "AWS::Lambda::Function":
                self.functions[logical] = self._function(logical, res.get("Properties", {}))
        self.role_policies = role_policies(self.resolver)
        for fn in self.functions.values():
            self._check_wiring(fn)
            if fn.identity is not None:
                # A role the template does not define (given as a parameter) has policies unknown here.
                fn.identity.register(self.role_policies.get(fn.identity.arn))
        if (layer := aws_limits.active()) is not None:
            # Lambda's Invoke of a function (`prewarm cluster add` invokes one) runs its handler here.
            for logical in self.functions:
                layer.lambdas.serve(self.physical[logical].ref, functools.partial(self.invoke, logical))
        # Local stand-in for EventBridge's bus: other processes (`prewarm local push`) drop events here.
        self.event_bus_url = self.sqs.create_queue(QueueName=f"{self.stack_name}-local-event-bus")["QueueUrl"]
        return self

    def _function_arn(self, logical_id: str) -> str:
        return str(self.physical[logical_id].attrs["Arn"])

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
        for key, spec in self.cloudformation.get("Outputs", {}).items():
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
        args = table_create_args(self.cloudformation, name, logical)
        self.dynamodb.create_table(**args)
        self.dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.05, "MaxAttempts": 200})
        table = self.dynamodb.describe_table(TableName=name)["Table"]
        policy = self.resolver.resolve(dict(self.cloudformation["Resources"][logical]["Properties"])).get(
            "ResourcePolicy")
        if policy:
            # moto keeps it; the AWS limits layer evaluates its Deny statements for each caller.
            self.dynamodb.put_resource_policy(ResourceArn=table["TableArn"],
                                              Policy=json.dumps(policy["PolicyDocument"]))
        attrs = {"Arn": table["TableArn"]}
        if table.get("LatestStreamArn"):
            attrs["StreamArn"] = table["LatestStreamArn"]
        self.physical[logical] = Physical(ref=name, attrs=attrs)

    def _function(self, logical: str, props: Mapping[str, Any]) -> Function:
        """The function SAM generated (`props`: its AWS::Lambda::Function's, Globals merged in, its role the
        template's or the one SAM makes), with the events the template gives it."""
        assert self.resolver is not None
        env = {k: str(v) for k, v in self.resolver.resolve(props.get("Environment", {}).get("Variables", {})).items()}
        if not props.get("Code") or not props.get("Handler"):
            raise WiringError(f"{logical}: CodeUri and Handler are required")
        template_props = self.template["Resources"][logical].get("Properties", {})
        events = self._event_sources(logical, template_props.get("Events", {}))
        # Resolved in its object, where `AWS::NoValue` removes it.
        reserved = self.resolver.resolve({"R": props.get("ReservedConcurrentExecutions")}).get("R")
        return Function(
            logical_id=logical,
            name=env.get("POWERTOOLS_SERVICE_NAME", logical),
            code_dir=project_files().root / local_code_path(props["Code"]),
            handler=str(props["Handler"]),
            env=env,
            timeout=int(props.get("Timeout", 3)),  # Lambda's defaults
            memory=int(props.get("MemorySize", 128)),
            events=events,
            identity=LocalIdentity.of_role(str(self.resolver.resolve(props["Role"]))),
            reserved_concurrency=None if reserved is None else int(reserved),
        )

    def _event_sources(self, logical: str, events: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Each of the function's events (the template's name and Type) with the properties, resolved, of what
        SAM generated for it under `<Function><Event>`: the event source mapping of an SQS or DynamoDB event,
        the rule of an EventBridgeRule or Schedule, the schedule of a ScheduleV2. A rule's `Target` is the one
        that invokes this function (its retries and dead-letter queue)."""
        assert self.resolver is not None
        arn = self.physical[logical].attrs["Arn"]
        found = {}
        for name, event in events.items():
            kind, generated = event.get("Type"), self.cloudformation["Resources"].get(f"{logical}{name}")
            if generated is None:
                if kind in SUPPORTED_EVENTS:
                    raise WiringError(f"{logical} event {name}: SAM generated no {logical}{name} for it")
                found[name] = {"Type": kind, "Properties": {}}  # refused by _check_wiring
                continue
            props = self.resolver.resolve(dict(generated.get("Properties", {})))
            if generated["Type"] == "AWS::Events::Rule":
                targets = props.pop("Targets", [])
                props["Target"] = next((t for t in targets if t.get("Arn") == arn), {})
            found[name] = {"Type": kind, "Properties": props}
        return found

    def _check_wiring(self, fn: Function) -> None:
        module_file, _, attr = fn.handler.rpartition(".")
        path = fn.code_dir / f"{module_file}.py"
        if not path.is_file():
            raise WiringError(f"{fn.logical_id}: handler file {shown(path)} does not exist")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.FunctionDef) and n.name == attr for n in tree.body):
            raise WiringError(f"{fn.logical_id}: {shown(path)} defines no function {attr}")
        for name, event in fn.events.items():
            kind, props = event.get("Type"), event.get("Properties", {})
            where = f"{fn.logical_id} event {name}"
            if kind == "SQS":
                self._queue_by_arn(props.get("EventSourceArn", ""), where)
            elif kind == "DynamoDB":
                stream = props.get("EventSourceArn")
                if stream not in {p.attrs.get("StreamArn") for p in self.physical.values()}:
                    raise WiringError(f"{where}: Stream {stream!r} is no table stream of this template")
                if not 1 <= int(props.get("ParallelizationFactor", 1)) <= 10:  # Lambda's range
                    raise WiringError(f"{where}: ParallelizationFactor must be 1 to 10")
                for f in props.get("FilterCriteria", {}).get("Filters", []):
                    try:
                        json.loads(f["Pattern"])
                    except (KeyError, ValueError) as e:
                        raise WiringError(f"{where}: filter pattern is not JSON: {e}") from e
            elif kind == "EventBridgeRule":
                if not isinstance(props.get("EventPattern"), dict):
                    raise WiringError(f"{where}: Pattern must be an object")
            elif kind in ("Schedule", "ScheduleV2"):
                parse_schedule(str(props.get("ScheduleExpression", "")), where)
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
        """Runs function `name` on `event` in its own environment; its answer, or `FunctionError`.

        Invocations overlap, each in an environment of its own (a process), as Lambda runs concurrent
        batches of one event source in separate environments; one past the function's timeout is killed.
        """
        fn = self.function(name)
        with self._lock:
            fn.invocations += 1
        try:
            return self.environments.invoke(fn, dict(event), lambda: self._environ(fn), lambda: self._spec(fn))
        except FunctionError:
            with self._lock:
                fn.errors += 1
            raise

    def _spec(self, fn: Function) -> dict[str, Any]:
        """What a new environment of `fn` is told: its code and what its context says."""
        return {"code_dir": str(fn.code_dir), "handler": fn.handler, "memory": fn.memory, "timeout": fn.timeout,
                "function_name": f"{self.stack_name}-{fn.logical_id}", "region": self.region, "account": ACCOUNT}

    def _environ(self, fn: Function) -> dict[str, str]:
        """A new environment's variables: this process's, then the function's, signing as its role."""
        # Read outside any principal's block (an agent in this process signing from `os.environ`).
        with self._gate.enter("the functions", contextlib.nullcontext):
            env = {**os.environ, **fn.env, **(fn.identity.environment() if fn.identity else {})}
        env.setdefault("AWS_ENDPOINT_URL", self.endpoint_url)
        # Lambda's runtime sets the Region of every function (its reserved variables).
        env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = self.region
        return env

    def update_function(self, name: str, *, code_dir: Path | None = None, handler: str | None = None,
                        environment: Mapping[str, str] | None = None, timeout: int | None = None) -> Function:
        """As Lambda's UpdateFunctionCode and UpdateFunctionConfiguration: new code, variables added to the
        function's and a new timeout, for the invocations that start from now on (in a new environment);
        those in flight finish."""
        fn = self.function(name)
        fn.code_dir, fn.handler, fn.timeout = code_dir or fn.code_dir, handler or fn.handler, timeout or fn.timeout
        fn.env = {**fn.env, **(environment or {})}
        self._check_wiring(fn)
        self.environments.retire(fn)
        return fn

    def signing_as(self, identity: LocalIdentity) -> contextlib.AbstractContextManager[None]:
        """A block in which boto3 clients built in this process sign as `identity` (an agent in this
        process, which builds its clients from the environment): another principal's blocks wait for it."""
        return self._gate.enter(f"principal {identity.arn}", lambda: patched_environ(identity.environment()))

    def start(self, *, schedules: bool = True, interval: float = 0.2) -> None:
        """Runs the event sources (see `EventSources.start`), and starts each function's environment now: a
        running stack's first deliveries do not wait for cold starts."""
        super().start(schedules=schedules, interval=interval)
        for fn in self.functions.values():
            self.environments.warm(fn, functools.partial(self._environ, fn), functools.partial(self._spec, fn))

    def keep_warm(self, name: str, count: int) -> None:
        """Starts environments of function `name` until it has `count`, as Lambda's provisioned
        concurrency: invocations up to that many at once start no environment. Returns once they loaded."""
        fn = self.function(name)
        self.environments.warm(fn, functools.partial(self._environ, fn), functools.partial(self._spec, fn), count,
                               wait=True)

    def cold_starts(self, name: str) -> int:
        """How many environments of function `name` were started so far."""
        return self.environments.cold_starts(self.function(name))

    def stop(self, timeout: float = 10.0) -> None:
        """Stops every event source, then ends every function's environment: no process is left."""
        super().stop(timeout)
        self.environments.end()  # and any a last batch started meanwhile

    def _end_invocations(self) -> None:
        self.environments.end()

    def env(self) -> dict[str, str]:
        """The environment every function shares (table, queues, prefixes) — for the CLI and agents."""
        common = None
        for fn in self.functions.values():
            common = dict(fn.env) if common is None else {k: v for k, v in common.items() if fn.env.get(k) == v}
        return {**(common or {}), **({"LOCAL_EVENT_BUS_URL": self.event_bus_url} if self.event_bus_url else {})}



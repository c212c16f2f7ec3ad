"""IAM in front of moto: each request from a principal the layer knows is decided by `policy.evaluate`
before moto runs it, and refused with the error its service answers.

A request is what IAM authorizes: one or more (action, resource ARN) pairs, each with the resource's own
policy when it has one (a queue's, a table's, a secret's, a repository's). The pairs are those of AWS's
"Service Authorization Reference" and each service's API reference:

- SQS: the queue of `QueueUrl` (or `QueueName`); a batch is authorized as its single action
  ("Amazon SQS API permissions: Actions and resource reference"); `ListQueues` takes `*`; a
  `CreateQueue` with tags needs `sqs:TagQueue` too (SQS API Reference, CreateQueue).
- DynamoDB: the table, or `table/T/index/I` for a Query or Scan of an index; a transaction needs the
  item action on each table it touches ("Using IAM with DynamoDB transactions"); stream reads are
  `dynamodb:` actions on the stream ARN.
- Secrets Manager: the secret (its ARN, or its name where it does not exist yet); a `CreateSecret`
  with tags needs `secretsmanager:TagResource` too (API Reference, CreateSecret).
- ECR: the repository; `GetAuthorizationToken` takes `*`.
- STS: `AssumeRole` on the role (the caller's side only: moto holds no trust policies to evaluate);
  `GetCallerIdentity` needs no permission and cannot be denied (STS API Reference, GetCallerIdentity).
  The keys an `AssumeRole` hands out sign as the role's session (`assumed-role/<role>/<session>`),
  held to the role's identity policies (`assumed_role_policies`), as on AWS: a token or a call made
  with them carries the role's permissions, not the caller's.
- SSM: the parameter.
- EC2: the operations of warm snapshots' bakes (`ec2.ec2_requests`), with the tags of the resource and of
  the request as condition keys, and `iam:PassRole` on the role of a RunInstances' instance profile;
  other EC2 operations are not evaluated. Refused with `UnauthorizedOperation`, as EC2 answers.

Requests to other services, and by principals whose identity policies are unknown, pass as before:
only a resource policy's explicit Deny refuses those (`policy.evaluate`).

Two answers moto cannot give, the layer gives: STS `GetCallerIdentity` of a principal it knows (its ARN),
and IAM's policy simulator, `SimulatePrincipalPolicy`, decided by the same `evaluate`.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

from moto.core.exceptions import ServiceException

from prewarm_devtools.aws_limits.ec2 import ec2_requests, fast_snapshot_restores, launch_template_version
from prewarm_devtools.aws_limits.events import event_pattern_test
from prewarm_devtools.aws_limits.policy import ContextValue, Decision, Policy, evaluate
from prewarm_devtools.aws_limits.sqs import access_key_id

if TYPE_CHECKING:
    from prewarm_devtools.aws_limits.layer import LayerState

# A code some service models do not declare (SQS's AccessDenied): boto3 reads it from the response all the same.
warnings.filterwarnings("ignore", r"Exception\(AccessDeniedError\) with code AccessDenied", UserWarning)


class AccessDeniedError(ServiceException):
    """What the service answers a refused request: `AccessDenied` (SQS, STS) or `AccessDeniedException`
    (DynamoDB, Secrets Manager, ECR, SSM), with AWS's message naming principal, action and resource."""


# Each service's refusal code ("Common Errors" of each API Reference).
_CODES = {"sqs": "AccessDenied", "sts": "AccessDenied", "ec2": "UnauthorizedOperation"}
_DEFAULT_CODE = "AccessDeniedException"


class Request(NamedTuple):
    """One (action, resource) pair IAM authorizes, with the resource's own policy (None: it has none) and
    the condition keys the request carries (tags)."""

    action: str
    resource: str
    resource_policy: Policy | None = None
    context: Mapping[str, ContextValue] = {}


class Authorization:
    """Decides every request of a known principal (`check`), counting refusals in the layer's stats."""

    def __init__(self, layer: LayerState) -> None:
        self.layer = layer
        self.fast_restores: dict[str, set[str]] = {}  # snapshot -> its zones with Fast Snapshot Restore

    def refusal(self, handler: Any) -> AccessDeniedError | None:
        """The error to answer `handler`'s request with, or None to let moto run it."""
        service = getattr(handler, "service_name", "")
        requests = _SERVICES.get(service)
        if requests is None:
            return None  # a service this evaluation does not model
        principal = self.layer.principals.arn(access_key_id(handler.headers))
        if principal is None:
            return None  # moto's default caller: nothing to evaluate
        identity = self.layer.principals.policies(principal)
        operation = handler._get_action()
        for request in requests(handler, operation):
            decision: Decision = evaluate(request.action, request.resource, principal, identity=identity,
                                          resource_policy=request.resource_policy, context=request.context)
            if not decision.allowed:
                code = _CODES.get(service, _DEFAULT_CODE)
                self.layer.stats.record_refusal(code)
                return AccessDeniedError(code, decision.message(principal, request.action, request.resource))
        return None

    def answer(self, handler: Any) -> Any:
        """What the layer answers in moto's place (a refusal, or a result moto cannot give), None to let
        moto run the request."""
        return (self.refusal(handler) or self.caller_identity(handler) or self.simulation(handler)
                or fast_snapshot_restores(handler, self.fast_restores) or launch_template_version(handler)
                or event_pattern_test(handler))

    def caller_identity(self, handler: Any) -> dict[str, str] | None:
        """STS's answer to a known principal's `GetCallerIdentity`: its ARN (moto knows its own users only,
        and answers `user/moto` for every other key). Locally a role's ARN, where AWS names the role's
        session (`assumed-role/<role>/<session>`), as the layer's refusals do. None: moto answers."""
        if getattr(handler, "service_name", "") != "sts" or handler._get_action() != "GetCallerIdentity":
            return None
        key = access_key_id(handler.headers)
        principal = self.layer.principals.arn(key)
        if principal is None or key is None:
            return None
        return {"UserId": key, "Account": principal.split(":")[4], "Arn": principal}

    def simulation(self, handler: Any) -> dict[str, Any] | ServiceException | None:
        """IAM's policy simulator (`SimulatePrincipalPolicy`, which moto lacks) for a principal the layer
        knows, or a role in moto's IAM: each action on each resource decided by `evaluate` with the
        principal's identity policies, as the simulator does without a resource policy given. An unknown
        principal is `NoSuchEntity`."""
        if getattr(handler, "service_name", "") != "iam" or handler._get_action() != "SimulatePrincipalPolicy":
            return None
        source = handler._get_param("PolicySourceArn") or ""
        if source in self.layer.principals.known():
            identity = self.layer.principals.policies(source)
        elif (identity := assumed_role_policies(self.layer, source)) is None:
            name = source.rsplit("/", 1)[-1]
            return NoSuchEntityError("NoSuchEntity", f"The role with name {name} cannot be found.")
        results = []
        for action in _members(handler, "ActionNames"):
            for resource in _members(handler, "ResourceArns") or ["*"]:
                decision = evaluate(action, resource, source, identity=identity)
                outcome = "allowed" if decision.allowed else "explicitDeny" if decision.explicit else "implicitDeny"
                results.append({"EvalActionName": action, "EvalResourceName": resource, "EvalDecision": outcome,
                                "MatchedStatements": [], "MissingContextValues": []})
        return {"EvaluationResults": results, "IsTruncated": False}


def assumed_role_policies(layer: LayerState, role_arn: str) -> tuple[Policy, ...] | None:
    """The identity policies of `role_arn` for the session `AssumeRole` starts: those the layer was given
    for the role (a local role from the template), else the role's inline and attached policies in moto's
    IAM, else None (unknown: nothing evaluated, as for any principal the layer was not told about)."""
    known = layer.principals.policies(role_arn)
    if known is not None:
        return known
    from moto.iam.exceptions import NotFoundException
    from moto.iam.models import iam_backends

    parts = role_arn.split(":")
    if len(parts) < 6 or not parts[5].startswith("role/"):
        return None
    try:
        role = iam_backends[parts[4]][parts[1]].get_role_by_arn(role_arn)
    except (NotFoundException, KeyError):
        return None
    documents = list(role.policies.values()) + [
        version.document for policy in role.managed_policies.values() for version in policy.versions
        if version.is_default]
    return tuple(json.loads(d) if isinstance(d, str) else d for d in documents)


class NoSuchEntityError(ServiceException):
    """IAM's answer about a principal it does not have."""


def _members(handler: Any, name: str) -> list[str]:
    """A list parameter of a query-protocol request (`Name.member.N`)."""
    given = handler._get_param(name)
    if isinstance(given, list):
        return [str(v) for v in given]
    return [str(v) for v in handler._get_multi_param(f"{name}.member")]


# -- the requests of each service ----------------------------------------------------------------------


def _sqs(handler: Any, operation: str) -> Iterator[Request]:
    # SQS names actions in lower case in its AccessDenied messages; IAM matches actions in any case.
    action = "sqs:" + operation.removesuffix("Batch").lower()
    if operation == "ListQueues":
        yield Request(action, "*")
        return
    region, account = handler.region, handler.current_account
    url = handler._get_param("QueueUrl")
    if url and "/" in url:
        path = urlparse(url).path.strip("/").split("/")
        account, name = (path[0], path[-1]) if len(path) >= 2 else (account, path[-1])
    else:
        name = handler._get_param("QueueName") or url or ""
        account = handler._get_param("QueueOwnerAWSAccountId") or account
    arn = f"arn:aws:sqs:{region}:{account}:{name}"
    queue = handler.sqs_backend.queues.get(name)
    policy = json.loads(queue.policy) if queue is not None and queue.policy else None
    # Condition keys SQS supports ("ABAC condition keys for Amazon SQS", SQS Developer Guide): the tags
    # a CreateQueue or TagQueue brings, and the queue's own tags.
    queue_tags = getattr(queue, "tags", None) or {}
    context: dict[str, ContextValue] = {f"aws:ResourceTag/{k}": v for k, v in queue_tags.items()}
    tags = _sqs_request_tags(handler, operation)
    if tags:
        context.update({f"aws:RequestTag/{k}": v for k, v in tags.items()})
        context["aws:TagKeys"] = tuple(tags)
    yield Request(action, arn, policy, context)
    if operation == "CreateQueue" and tags:
        yield Request("sqs:tagqueue", arn, policy, context)


def _sqs_request_tags(handler: Any, operation: str) -> dict[str, str]:
    """The tags of a CreateQueue (`tags`) or TagQueue (`Tags`), in SQS's JSON or query protocol."""
    if operation not in ("CreateQueue", "TagQueue"):
        return {}
    given = handler._get_param("tags" if operation == "CreateQueue" else "Tags")
    if isinstance(given, Mapping):
        return {str(k): str(v) for k, v in given.items()}
    if operation == "TagQueue" and hasattr(handler, "_get_map_prefix"):
        return dict(handler._get_map_prefix("Tag", key_end="Key", value_end="Value") or {})
    return {}


_DYNAMODB_TRANSACT = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                      "ConditionCheck": "ConditionCheckItem", "Get": "GetItem"}


def _dynamodb(handler: Any, operation: str) -> Iterator[Request]:
    params: Mapping[str, Any] = handler.body if isinstance(handler.body, Mapping) else {}
    backend = handler.dynamodb_backend
    if operation in ("TransactWriteItems", "TransactGetItems"):
        for item in params.get("TransactItems") or []:
            for kind, op in item.items():
                yield _table_request(backend, handler, "dynamodb:" + _DYNAMODB_TRANSACT[kind], op["TableName"])
    elif operation in ("BatchGetItem", "BatchWriteItem"):
        for table in params.get("RequestItems") or {}:
            yield _table_request(backend, handler, "dynamodb:" + operation, table)
    elif params.get("TableName"):
        yield _table_request(backend, handler, "dynamodb:" + operation, params["TableName"], params.get("IndexName"))
    elif params.get("ResourceArn"):
        arn = params["ResourceArn"]
        policy = backend.resource_policies.get(arn)
        yield Request("dynamodb:" + operation, arn, json.loads(policy.policy_doc) if policy else None)
    else:
        yield Request("dynamodb:" + operation, "*")


def _table_request(backend: Any, handler: Any, action: str, table: str, index: str | None = None) -> Request:
    found = backend.tables.get(table)
    arn = found.table_arn if found is not None else (
        f"arn:aws:dynamodb:{handler.region}:{handler.current_account}:table/{table}")
    policy = backend.resource_policies.get(arn)
    # A table's policy governs its indexes too ("Resource-based policies for DynamoDB").
    resource = f"{arn}/index/{index}" if index else arn
    return Request(action, resource, json.loads(policy.policy_doc) if policy else None)


def _dynamodb_streams(handler: Any, operation: str) -> Iterator[Request]:
    # GetRecords names its shard iterator, which moto spells as the stream's ARN, then `|`.
    stream = handler._get_param("StreamArn") or (handler._get_param("ShardIterator") or "").split("|")[0]
    yield Request("dynamodb:" + operation, stream or "*")


def _secretsmanager(handler: Any, operation: str) -> Iterator[Request]:
    action = "secretsmanager:" + operation
    secret_id = handler._get_param("SecretId") or handler._get_param("Name")
    if not secret_id:
        yield Request(action, "*")
        return
    secrets = handler.backend.secrets
    if secret_id in secrets:  # by name or ARN: moto's store answers both, its `get` by name only
        secret = secrets[secret_id]
        arn, policy = secret.arn, json.loads(secret.policy) if secret.policy else None
    else:
        arn = secret_id if secret_id.startswith("arn:") else (
            f"arn:aws:secretsmanager:{handler.region}:{handler.current_account}:secret:{secret_id}")
        policy = None
    yield Request(action, arn, policy)
    if operation == "CreateSecret" and handler._get_param("Tags"):
        yield Request("secretsmanager:TagResource", arn, policy)


def _ecr(handler: Any, operation: str) -> Iterator[Request]:
    action = "ecr:" + operation
    names = handler._get_param("repositoryNames") or [handler._get_param("repositoryName")]
    names = [n for n in names if n]
    if not names:
        yield Request(action, "*")
        return
    account = handler._get_param("registryId") or handler.current_account
    for name in names:
        repository = handler.ecr_backend.repositories.get(name)
        arn = repository.arn if repository is not None else f"arn:aws:ecr:{handler.region}:{account}:repository/{name}"
        policy = json.loads(repository.policy) if repository is not None and repository.policy else None
        yield Request(action, arn, policy)


def _sts(handler: Any, operation: str) -> Iterator[Request]:
    if operation == "GetCallerIdentity":
        return  # needs no permission, and an explicit Deny does not stop it
    yield Request("sts:" + operation, handler._get_param("RoleArn") or "*")


def _ssm(handler: Any, operation: str) -> Iterator[Request]:
    names = handler._get_param("Names") or [handler._get_param("Name")]
    names = [n for n in names if n]
    if not names:
        yield Request("ssm:" + operation, "*")
    for name in names:
        path = name if name.startswith("/") else f"/{name}"
        where = f"{handler.region}:{handler.current_account}"
        arn = name if name.startswith("arn:") else f"arn:aws:ssm:{where}:parameter{path}"
        yield Request("ssm:" + operation, arn)


def _ec2(handler: Any, operation: str) -> Iterator[Request]:
    for action, resource, context in ec2_requests(handler, operation):
        yield Request(action, resource, None, context)


def _scheduler(handler: Any, operation: str) -> Iterator[Request]:
    from prewarm_devtools.aws_limits.scheduler import schedule_name

    group = handler._get_param("GroupName") or handler.querystring.get("groupName", ["default"])[0]
    where = f"{handler.region}:{handler.current_account}"
    yield Request("scheduler:" + operation, f"arn:aws:scheduler:{where}:schedule/{group}/{schedule_name(handler)}"
                  if operation.endswith("Schedule") else "*")
    role = (handler._get_param("Target") or {}).get("RoleArn")
    if role and operation in ("CreateSchedule", "UpdateSchedule"):
        # The target's role is passed to Scheduler (EventBridge Scheduler User Guide, execution role).
        yield Request("iam:PassRole", role, context={"iam:PassedToService": "scheduler.amazonaws.com"})


_SERVICES: dict[str, Callable[[Any, str], Iterator[Request]]] = {
    "sqs": _sqs,
    "dynamodb": _dynamodb,
    "dynamodbstreams": _dynamodb_streams,
    "secretsmanager": _secretsmanager,
    "ecr": _ecr,
    "sts": _sts,
    "ssm": _ssm,
    "scheduler": _scheduler,
    "ec2": _ec2,
}

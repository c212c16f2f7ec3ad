"""Where the layer hooks into moto: its request handlers' actions, the table copy of a transaction,
how reads are answered, stream reads and backend resets. moto has no plugin API, so these are patches
of its classes, put in place by `install` and taken out by `uninstall`; one set serves `mock_aws` and
`ThreadedMotoServer` alike, since both dispatch each request to the same handler classes in this process."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_originals: list[tuple[Any, str, Any]] = []

DYNAMODB_ACTIONS = ("put_item", "update_item", "delete_item", "batch_write_item", "transact_write_items",
                    "get_item", "batch_get_item", "query", "transact_get_items")
# Reads whose answers are items: moto's DynamoResult holds them as wire JSON already.
JSON_READS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"})
SQS_ACTIONS = ("create_queue", "delete_queue", "send_message", "send_message_batch", "delete_message_batch",
               "change_message_visibility_batch")


def install(current: Callable[[], Any]) -> None:
    """Patches moto; `current()` answers the active layer (an `AwsLimits`) or None to pass through."""
    import moto.backends as moto_backends
    import moto.dynamodb.models as dynamodb_models
    from moto.core.base_backend import BackendDict
    from moto.core.responses import BaseResponse
    from moto.dynamodb.responses import DynamoHandler, DynamoResult
    from moto.dynamodbstreams.models import DynamoDBStreamsBackend, ShardIterator
    from moto.ecr.responses import ECRResponse
    from moto.scheduler.responses import EventBridgeSchedulerResponse
    from moto.sqs.responses import SQSResponse
    from moto.sts.models import STSBackend

    from prewarm_devtools.aws_limits import eks, lambdas, queues, scheduler
    from prewarm_devtools.aws_limits.tables import TABLES_ARE_NOT_COPIED, query_patches

    with _lock:
        if _originals:
            return
        for cls, names, part in ((DynamoHandler, DYNAMODB_ACTIONS, "dynamodb"), (SQSResponse, SQS_ACTIONS, "sqs"),
                                 (ECRResponse, ("get_authorization_token",), "ecr"),
                                 (EventBridgeSchedulerResponse, scheduler.ACTIONS, "scheduler")):
            for name in names:
                _replace(cls, name, _guarded(cls.__dict__[name], name, part, current))
        # moto deep-copies each table a transaction names, stream included, to roll back; the layer's
        # ItemSnapshot rolls back the touched items instead.
        _replace(dynamodb_models, "copy", TABLES_ARE_NOT_COPIED)
        # moto sorts and walks every item of the table on each Query: the same answers from the items it may answer.
        for owner, name, value in query_patches():
            _replace(owner, name, value)
        # moto answers a read by walking botocore's output shape, member by member of every item: 7 ms
        # a GetItem here, most of what a read costs it. The same JSON at a json.dumps' cost.
        _replace(DynamoResult, "execute_result", _read_as_json(DynamoResult.execute_result))
        _replace(DynamoDBStreamsBackend, "get_shard_iterator",
                 _started_reader(DynamoDBStreamsBackend.get_shard_iterator, current))
        _replace(ShardIterator, "get", _read_records(ShardIterator.get, current))
        # moto's server lists its own package directory on every request, under the lock all requests
        # share (a third of a busy server's time); the list does not change while it runs.
        _replace(moto_backends, "list_of_moto_modules", _listed_once(moto_backends.list_of_moto_modules))
        # moto walks a queue's every message on each call; the same answers at a call's cost.
        for owner, name, value in queues.patches():
            _replace(owner, name, value)
        # EKS's access entries and DescribeCluster for the clusters the layer serves (local mode's APIs).
        for owner, name, value in eks.patches(current):
            _replace(owner, name, value)
        # Invoke of a local stack's functions: the stack runs them, each in its own environment.
        for owner, name, value in lambdas.patches(current):
            _replace(owner, name, value)
        _replace(STSBackend, "assume_role", _session_keys(STSBackend.assume_role, current))
        # Every service's requests pass IAM first, as on AWS, before any of the checks above.
        _replace(BaseResponse, "call_action", _authorized(BaseResponse.call_action, current))
        reset = BackendDict.__dict__["reset"].__func__
        _replace(BackendDict, "reset", classmethod(_resetting(reset, current)))


def install_late(owner: Any, name: str, value: Any) -> None:
    """One more patch, put in place while the others are (and taken out with them): for what only some runs
    need, whose moto module costs every other run its import (EC2's, for local mode's builders)."""
    with _lock:
        if _originals and not any(o is owner and n == name for o, n, _ in _originals):
            _replace(owner, name, value)


def uninstall() -> None:
    with _lock:
        while _originals:
            owner, name, original = _originals.pop()
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


_INHERITED = object()


def _replace(owner: Any, name: str, value: Any) -> None:
    """`owner.name = value`, remembering what to put back (an inherited attribute: nothing of its own)."""
    _originals.append((owner, name, owner.__dict__.get(name, _INHERITED)))
    setattr(owner, name, value)


def _listed_once(original: Callable[[], Any]) -> Callable[[], Any]:
    modules: list[tuple[str, ...]] = []

    @functools.wraps(original)
    def listed() -> tuple[str, ...]:
        if not modules:
            modules.append(tuple(original()))
        return modules[0]

    return listed


def _read_as_json(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    @functools.wraps(original)
    def execute_result(result: Any, context: Any) -> Any:
        answer = result.result
        if context.operation_model.name not in JSON_READS or not isinstance(answer, dict):
            return original(result, context)
        try:
            # The serializer leaves out members that are None (a Query's LastEvaluatedKey on its last page).
            body = json.dumps({key: value for key, value in answer.items() if value is not None})
        except (TypeError, ValueError):
            return original(result, context)
        version = context.service_model.metadata.get("jsonVersion", "1.0")
        return 200, {"Content-Type": f"application/x-amz-json-{version}"}, body

    return execute_result


def _guarded(original: Callable[[Any], Any], name: str, part: str, current: Callable[[], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def limited(handler: Any) -> Any:
        layer = current()
        if layer is None:
            return original(handler)
        return getattr(layer, part).guard(name, handler, lambda: original(handler))

    return limited


def _authorized(original: Callable[[Any], Any], current: Callable[[], Any]) -> Callable[[Any], Any]:
    from moto.core.responses import ActionResult

    @functools.wraps(original)
    def call_action(handler: Any) -> Any:
        layer = current()
        answer = None if layer is None else layer.authorization.answer(handler)
        if answer is None:
            return original(handler)
        # As moto's own call_action answers a result or a ServiceException: in the protocol the client spoke.
        status, headers, body = handler.serialized(ActionResult(answer))
        headers["status"] = status
        status, headers, body = handler._transform_response(handler.response_headers, (body, headers))
        headers, body = handler._enrich_response(headers, body)
        return status, headers, body

    return call_action


def _session_keys(original: Callable[..., Any], current: Callable[[], Any]) -> Callable[..., Any]:
    """The keys an AssumeRole hands out sign as the role's session, with the role's policies."""
    from prewarm_devtools.aws_limits.authorization import assumed_role_policies

    @functools.wraps(original)
    def assume_role(backend: Any, *args: Any, **kwargs: Any) -> Any:
        session = original(backend, *args, **kwargs)
        if (layer := current()) is not None:
            layer.principals.add(session.access_key_id, session.arn, assumed_role_policies(layer, session.role_arn))
        return session

    return assume_role


def _started_reader(original: Callable[..., Any], current: Callable[[], Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_shard_iterator(backend: Any, *args: Any, **kwargs: Any) -> Any:
        iterator = original(backend, *args, **kwargs)
        if (layer := current()) is not None:
            layer.streams.started(iterator)
        return iterator

    return get_shard_iterator


def _read_records(original: Callable[..., Any], current: Callable[[], Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get(iterator: Any, limit: int = 1000) -> Any:
        layer = current()
        if layer is None:
            return original(iterator, limit)
        with layer.dynamodb.write_lock:
            shard = iterator.stream_shard
            # Records before the shard's first were dropped: read on from the oldest kept.
            iterator.sequence_number = max(int(iterator.sequence_number), shard.starting_sequence_number)
            result = original(iterator, limit)
            following = iterator.streams_backend.shard_iterators[result["NextShardIterator"]]
            layer.streams.read(iterator, following, iterator.streams_backend)
            return result

    return get


def _resetting(original: Callable[[Any], Any], current: Callable[[], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def reset(cls: Any) -> None:
        original(cls)
        if (layer := current()) is not None:
            layer.reset()

    return reset

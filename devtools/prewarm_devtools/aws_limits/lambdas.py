"""Lambda's `Invoke` in front of moto, for a local stack's functions: moto would run a function's code in a
container, and knows none of the stack's. The layer answers for each function it serves (`LambdaFunctions.serve`:
`LocalStack` serves each one it deploys) with the stack's invoke, which runs it in its own environment
(`sam.environments`); other names are moto's.

A `RequestResponse` invocation (the CLI's one-off calls, `prewarm cluster add`'s check) answers the handler's
JSON, or, when the handler raised, Lambda's `X-Amz-Function-Error: Unhandled` with `errorMessage` and
`errorType` ("Lambda API Reference", Invoke). A served function is configuration, kept by a moto reset.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

Handler = Callable[[dict[str, Any]], Any]


class LambdaFunctions:
    """The functions the layer runs, by name (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._functions: dict[str, Handler] = {}

    def serve(self, name: str, run: Handler) -> None:
        """Answers `Invoke` of function `name` from now on: `run(event)`."""
        with self._lock:
            self._functions[name] = run

    def served(self, name: str) -> Handler | None:
        with self._lock:
            return self._functions.get(name)

    def invoke(self, run: Handler, body: Any) -> tuple[int, dict[str, str], str]:
        headers = {"content-type": "application/json", "X-Amz-Executed-Version": "$LATEST"}
        try:
            event = json.loads(body or b"{}")
            if not isinstance(event, dict):
                raise ValueError(f"the event is a JSON {type(event).__name__}, not an object")
            return 200, headers, json.dumps(run(event), default=str)
        except Exception as e:  # noqa: BLE001 (Lambda answers a handler's error, the caller reads it)
            return 200, {**headers, "X-Amz-Function-Error": "Unhandled"}, json.dumps(
                {"errorMessage": str(e), "errorType": type(e).__name__})


def function_name(path: str) -> str:
    """The function an invocation path names, by name or ARN (`.../functions/<name or ARN>/invocations`).

    >>> function_name("/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-west-2%3A1%3Afunction%3Apw-Sync/invocations")
    'pw-Sync'
    """
    named = unquote(path.rstrip("/").rsplit("/", 2)[-2])
    return named.rsplit(":function:", 1)[-1].split(":", 1)[0]


def patches(current: Callable[[], Any]) -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for `patches.install`: `Invoke` of a served function."""
    from moto.awslambda.responses import LambdaResponse

    original = LambdaResponse.__dict__["invoke"]

    def invoke(handler: Any) -> Any:
        layer = current()
        run = None if layer is None else layer.lambdas.served(function_name(handler.path))
        if run is None or handler.headers.get("X-Amz-Invocation-Type", "RequestResponse") != "RequestResponse":
            return original(handler)
        return layer.lambdas.invoke(run, handler.body)

    return [(LambdaResponse, "invoke", invoke)]

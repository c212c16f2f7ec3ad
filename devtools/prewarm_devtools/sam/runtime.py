"""One function's execution environment: `python -m prewarm_devtools.sam.runtime`, a process of its own.

As Lambda's runtime, it loads the function's handler once (its environment is this process's, set
before anything is imported), then runs each invocation it is sent. It speaks JSON lines with the stack
(`sam.environments`): stdin brings `{"function": ...}` first, then `{"id": n, "event": ...}`; stdout
carries `{"ready": file}`, what the function prints (`{"out": line}`) and each `{"id": n, "result": ...}`
or `{"id": n, "error": ...}`. It runs one invocation at a time, as a Lambda environment does (the
stack starts more environments for concurrent ones), and the stack kills it at the function's timeout.
End of stdin ends it; so does a stack gone in mid-invocation, at the function's timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


class Channel:
    """The frames to the stack, whole lines at a time from any thread."""

    def __init__(self, stream: TextIO) -> None:
        self._stream, self._lock = stream, threading.Lock()

    def send(self, **frame: Any) -> None:
        line = json.dumps(frame)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


class FunctionOutput:
    """sys.stdout here: each thread's lines (its logs, its metrics, its prints) go to the stack as `out` frames,
    a line kept whole though `print` writes it in pieces."""

    def __init__(self, channel: Channel) -> None:
        self._channel, self._partial = channel, threading.local()

    def write(self, text: str) -> int:
        pending = getattr(self._partial, "text", "") + text
        *lines, self._partial.text = pending.split("\n")
        for line in lines:
            self._channel.send(out=line)
        return len(text)

    def flush(self) -> None:
        if text := getattr(self._partial, "text", ""):
            self._partial.text = ""
            self._channel.send(out=text)

    def isatty(self) -> bool:
        return False


def load(spec: dict[str, Any]) -> Callable[[Any, Any], Any]:
    """The function's handler (`app.lambda_handler`: `lambda_handler` of `<code_dir>/app.py`)."""
    module_file, _, attr = spec["handler"].rpartition(".")
    path = Path(spec["code_dir"]) / f"{module_file}.py"
    module_spec = importlib.util.spec_from_file_location(f"prewarm_function_{path.parent.name}", path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    handler: Callable[[Any, Any], Any] = getattr(module, attr)
    return handler


def invoke(handler: Callable[[Any, Any], Any], spec: dict[str, Any], request: dict[str, Any],
           channel: Channel, output: FunctionOutput) -> None:
    from prewarm_devtools.sam.events import LambdaContext

    context = LambdaContext(spec["function_name"], spec["region"], spec["account"], spec["memory"], spec["timeout"],
                            request.get("request_id"))
    try:
        result = handler(request["event"], context)
    except Exception as e:  # noqa: BLE001 - every handler error is the invocation's, as Lambda reports it
        print("".join(traceback.format_exception(e)).rstrip())  # to the function's log, as Lambda's runtime
        output.flush()
        channel.send(id=request["id"], error={"type": type(e).__name__, "message": str(e)})
        return
    output.flush()
    try:
        channel.send(id=request["id"], result=result)
    except (TypeError, ValueError) as e:  # Lambda's Runtime.MarshalError
        channel.send(id=request["id"], error={"type": "Runtime.MarshalError",
                                              "message": f"the answer is not JSON: {e}"})


def main() -> None:
    # Its life is the stack's (the end of stdin, or a kill): a Ctrl-C at the terminal is for the stack.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The frames keep the real stdout; what writes to file descriptor 1 directly (a child process) goes to
    # stderr, so it cannot break a frame.
    channel = Channel(os.fdopen(os.dup(1), "w", encoding="utf-8"))
    os.dup2(2, 1)
    output = FunctionOutput(channel)
    sys.stdout = output  # before the handler's imports: its loggers write here
    spec = json.loads(sys.stdin.readline())["function"]
    try:
        handler = load(spec)
    except Exception as e:  # noqa: BLE001 - Lambda's Runtime.ImportModuleError, told to every invocation
        print("".join(traceback.format_exception(e)).rstrip())
        output.flush()
        channel.send(failed=f"{type(e).__name__}: {e}")
        return
    channel.send(ready=str(sys.modules[handler.__module__].__file__))
    for line in sys.stdin:
        request = json.loads(line)
        thread = threading.Thread(target=invoke, args=(handler, spec, request, channel, output),
                                  name=f"invocation-{request['id']}", daemon=True)
        thread.start()
        # The stack kills this process at the timeout; this is for a stack that is gone meanwhile.
        thread.join(spec["timeout"] + 1)
        if thread.is_alive():
            os._exit(1)


if __name__ == "__main__":
    main()

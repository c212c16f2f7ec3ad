"""One cold start, as the Lambda runtime does it: import the handler module, then invoke it once.

`python -m benchmarks.lambda_init CODE_DIR MODULE [--event FILE]` puts CODE_DIR first on sys.path
(Lambda's /var/task), imports MODULE and, with an event, calls its `lambda_handler` with a
Lambda-like context. Prints one JSON line: `import_ms`, `import_cpu_ms`, `first_invoke_ms`, the
error if the handler raised, and `shared_package`, the file the `prewarm` package was imported from
(None if it was not). Imports nothing heavy itself, so the import is measured clean.
"""

from __future__ import annotations

import sys
import time


class LambdaContext:
    """What handlers read from Lambda's context object."""

    def __init__(self, function_name: str, memory_mb: int, timeout_s: float) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-west-2:123456789012:function:{function_name}"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = "00000000-0000-4000-8000-000000000000"
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "2026/01/01/[$LATEST]bench"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def main(argv: list[str]) -> int:
    code_dir, module_name = argv[0], argv[1]
    event_file = argv[argv.index("--event") + 1] if "--event" in argv else None
    sys.path.insert(0, code_dir)
    started, cpu = time.perf_counter(), time.process_time()
    module = __import__(module_name)
    import_ms, import_cpu_ms = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
    import json  # after the clock: handlers import it anyway, Lambda's runtime already has it

    result: dict[str, object] = {"import_ms": import_ms, "import_cpu_ms": import_cpu_ms}
    if event_file is not None:
        with open(event_file) as f:
            event = json.load(f)
        import os

        context = LambdaContext(os.environ.get("AWS_LAMBDA_FUNCTION_NAME", module_name),
                                int(os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")), 60)
        started = time.perf_counter()
        try:
            module.lambda_handler(event, context)
            result["error"] = None
        except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the benchmark
            result["error"] = f"{type(e).__name__}: {e}"
        result["first_invoke_ms"] = (time.perf_counter() - started) * 1000
    result["shared_package"] = getattr(sys.modules.get("prewarm"), "__file__", None)
    result["deps_package"] = getattr(sys.modules.get("botocore"), "__file__", None)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""CEL expressions, compiled once and evaluated over JSON values: what ValidatingAdmissionPolicies
(`admission.py`) and CRD validation rules (`validationrules.py`) both run.

CEL is cel-python's implementation: Kubernetes' CEL libraries (quantity, IP, URL, format, list and
regex extras) and its type checking and cost estimation are not there, so an expression that uses them
fails to compile here.
"""

from __future__ import annotations

import re
import threading
from typing import Any


class CelFailure(Exception):
    """An expression did not compile or evaluate; the message says which and why."""


class CelCompileError(CelFailure):
    """An expression did not compile (`compilation failed: ...`)."""


class CelPrograms:
    """Compiled programs by expression text, shared by every request (compiling is the slow part)."""

    def __init__(self) -> None:
        self._programs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def compile(self, expression: str) -> Any:
        """The program of `expression`; `CelFailure` when it does not compile."""
        import celpy  # cel-python: a dev dependency, as local mode is

        with self._lock:
            program = self._programs.get(expression)
            if program is None:
                environment = celpy.Environment()
                try:
                    program = environment.program(environment.compile(expression))
                except Exception as e:  # noqa: BLE001 - cel-python's parse errors have no common base
                    raise CelCompileError(f"compilation failed: {e}") from None
                self._programs[expression] = program
        return program

    def evaluate(self, expression: str, activation: dict[str, Any]) -> Any:
        """The value of `expression` with the JSON values of `activation` bound to their names."""
        from celpy.adapter import json_to_cel
        from celpy.evaluation import CELEvalError

        program = self.compile(expression)
        try:
            result = program.evaluate({k: json_to_cel(v) for k, v in activation.items()})
        except Exception as e:  # noqa: BLE001 - evaluation errors come in many kinds
            raise CelFailure(cel_go_text(e)) from None
        if isinstance(result, CELEvalError):
            raise CelFailure(cel_go_text(result))
        return result


_MEMBER = re.compile(r"no such member in mapping: '(.*)'")


def cel_go_text(error: Exception) -> str:
    """An evaluation error in cel-go's words (`division by zero`, `no such key: x`), not cel-python's
    (message, exception class, arguments) tuple."""
    args = error.args
    text = str(args[0]) if args else str(error)
    cause = args[1] if len(args) > 1 else None
    detail = " ".join(str(a) for a in args[2]) if len(args) > 2 and isinstance(args[2], tuple) else ""
    if cause is ZeroDivisionError:
        return "modulus by zero" if "division" not in detail else "division by zero"
    if member := _MEMBER.fullmatch(text):
        return f"no such key: {member.group(1)}"
    if "no matching overload" in text or text.startswith("no such overload"):
        return "no such overload"
    if cause is IndexError:
        return "index out of bounds"
    return text

"""CEL expressions, compiled once and evaluated over JSON values: what ValidatingAdmissionPolicies
(`admission.py`) and CRD validation rules (`validationrules.py`) both run.

CEL is cel-python's implementation: Kubernetes' CEL libraries (quantity, IP, URL, format, list and
regex extras) and its type checking and cost estimation are not there, so an expression that uses them
fails to compile here.
"""

from __future__ import annotations

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
            raise CelFailure(str(e)) from None
        if isinstance(result, CELEvalError):
            raise CelFailure(str(result))
        return result

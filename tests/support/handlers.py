"""The functions' handler modules, loaded from `functions/<name>/app.py` as Lambda loads them."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from prewarm_devtools.sam.template import ROOT


def load_handler(function: str) -> ModuleType:
    """`load_handler("dispatch_job").lambda_handler(event, context)`; each call imports the module afresh."""
    path = ROOT / "functions" / function / "app.py"
    spec = importlib.util.spec_from_file_location(f"handler_under_test_{function}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

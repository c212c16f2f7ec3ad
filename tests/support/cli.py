"""The CLI as tests call it in-process."""

from __future__ import annotations

from collections.abc import Callable

from click.testing import Result

#: `prewarm("get", "jobs")`: runs the CLI with these arguments and returns click's `Result`.
Run = Callable[..., Result]

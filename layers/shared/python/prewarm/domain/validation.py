"""How a pydantic `ValidationError` reads to a user: one "field: what is wrong" per problem, joined by
"; ". Settings, events, messages, the credentials config and the agent's environment all say it so;
the job models translate theirs into Kubernetes field paths instead (`prewarm.domain.kubernetes`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

ErrorDetail = Any  # pydantic_core.ErrorDetails, a TypedDict: loc, msg, type, ctx
Loc = Sequence[int | str]


def dotted(loc: Loc) -> str:
    """`spec.images.0`: the location as pydantic gives it, joined by dots."""
    return ".".join(str(part) for part in loc)


def describe_validation_error(
    error: ValidationError,
    *,
    subject: str,
    path: Callable[[Loc], str] = dotted,
    problem: Callable[[ErrorDetail], str] | None = None,
    skip: Callable[[ErrorDetail, Sequence[ErrorDetail]], bool] | None = None,
) -> str:
    """Each problem as `<path>: <message>` (`subject` where the path is empty, i.e. the whole input),
    joined by "; ". `problem` words an item itself instead; `skip` leaves out an item that another says
    better. Never includes the input value, which may be a secret."""
    errors = error.errors(include_url=False, include_input=False)
    return "; ".join(
        problem(item) if problem is not None else f"{path(item['loc']) or subject}: {item['msg']}"
        for item in errors
        if skip is None or not skip(item, errors)
    )

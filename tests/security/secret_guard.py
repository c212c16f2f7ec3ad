"""A pytest plugin that fails any test letting a registry secret reach a log line or an exception's text.

Secrets are registered for the whole session by every `RegistryAuth` built while tests run (its
password and its `auth` field: ECR tokens, docker config entries and pull secrets all pass through
it), by tests through the `known_secrets` fixture, and the canaries below. A secret also counts
when it appears base64-encoded inside something longer (a dockerconfigjson secret's data): it is
searched for in each of its three base64 alignments.

Checked: every log record any logger emits (its message, its extra fields and the messages of its
exception chain, whatever handlers or propagation it has), the exception a test phase fails with,
and exceptions caught by `pytest.raises`. Not checked: stdout, traceback source lines, and keys
appended to the Powertools logger. The report names the secret by label, never by value.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from prewarm.domain.registries import RegistryAuth

# Values the credential and agent tests may use as secrets; any test may log-check against them.
CANARY_PASSWORD = "canary-registry-password-5d1f0a"
CANARY_ECR_TOKEN = base64.b64encode(b"AWS:canary-ecr-token-8e2c71b4").decode()
CANARIES = {"canary registry password": CANARY_PASSWORD, "canary ECR token": CANARY_ECR_TOKEN}
# Shorter values are too likely to be ordinary text: the node harness's registry password
# "pull-secret" is also part of every pull secret's ARN. Real tokens and passwords are longer.
MIN_SECRET_LENGTH = 12
_RECORD_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def base64_needles(secret: str) -> list[str]:
    """What base64 of any text containing `secret` must contain, for each alignment of the secret."""
    raw = secret.encode()
    needles = []
    for start in range(3):
        whole = raw[start:][: (len(raw) - start) // 3 * 3]
        if len(whole) >= 6:
            needles.append(base64.b64encode(whole).decode())
    return needles


@dataclass(frozen=True)
class Leak:
    label: str
    where: str

    def __str__(self) -> str:
        return f"{self.label} appeared in {self.where}"


class SecretGuard:
    """The registered secrets, and the leaks found since they were last taken."""

    def __init__(self) -> None:
        self._needles: dict[str, str] = {}
        self._leaks: list[Leak] = []
        self._lock = threading.Lock()

    def register(self, value: str, label: str) -> None:
        """Treats `value` (and its base64 forms) as a secret from now on; short values are ignored."""
        if len(value) < MIN_SECRET_LENGTH:
            return
        with self._lock:
            for needle in (value, *base64_needles(value)):
                self._needles.setdefault(needle, label)

    def find(self, texts: Iterable[str], where: str) -> list[Leak]:
        needles = self._needles
        if not needles:
            return []
        found = {label for text in texts for needle, label in list(needles.items()) if needle in text}
        leaks = [Leak(label, where) for label in sorted(found)]
        self._leaks.extend(leaks)
        return leaks

    def check_record(self, record: logging.LogRecord) -> None:
        if not self._needles:
            return
        self.find(_record_texts(record), f"a log line of {record.name!r} at {record.levelname}")

    def check_exception(self, error: BaseException, where: str) -> None:
        if self._needles:
            self.find(_exception_texts(error), f"{where} ({type(error).__name__})")

    def take_leaks(self) -> list[Leak]:
        with self._lock:
            leaks, self._leaks = self._leaks, []
        return leaks


def _exception_texts(error: BaseException | None) -> Iterator[str]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield str(error)
        yield from (str(note) for note in getattr(error, "__notes__", ()))
        error = error.__cause__ or error.__context__


def _record_texts(record: logging.LogRecord) -> Iterator[str]:
    try:
        yield record.getMessage()
    except (TypeError, ValueError):  # arguments that do not fit the format: logging reports that itself
        yield f"{record.msg} {record.args!r}"
    for name, value in record.__dict__.items():
        if name not in _RECORD_FIELDS:
            yield f"{value}"
    if record.exc_info and record.exc_info[1] is not None:
        yield from _exception_texts(record.exc_info[1])


GUARD = SecretGuard()
_installed: list[Callable[[], None]] = []


def _install() -> None:
    """Hooks logging, `RegistryAuth` construction and `pytest.raises`; undone by `_uninstall`."""
    call_handlers = logging.Logger.callHandlers
    auth_init = RegistryAuth.__init__
    fill_unfilled = pytest.ExceptionInfo.fill_unfilled

    def guarded_call_handlers(self: logging.Logger, record: logging.LogRecord) -> None:
        GUARD.check_record(record)
        call_handlers(self, record)

    def registering_init(self: RegistryAuth, *args: Any, **kwargs: Any) -> None:
        auth_init(self, *args, **kwargs)
        if not _in_hypothesis():  # generated values are not secrets, and there are thousands
            GUARD.register(self.password, f"the password of a RegistryAuth for {self.server!r}")
            GUARD.register(self.auth, f"the auth field of a RegistryAuth for {self.server!r}")

    def checking_fill(self: pytest.ExceptionInfo[Any], exc_info: Any) -> None:
        fill_unfilled(self, exc_info)
        GUARD.check_exception(exc_info[1], "an exception caught by pytest.raises")

    logging.Logger.callHandlers = guarded_call_handlers  # type: ignore[method-assign]
    RegistryAuth.__init__ = registering_init  # type: ignore[method-assign,unused-ignore]
    pytest.ExceptionInfo.fill_unfilled = checking_fill  # type: ignore[method-assign]

    def restore() -> None:
        logging.Logger.callHandlers = call_handlers  # type: ignore[method-assign]
        RegistryAuth.__init__ = auth_init  # type: ignore[method-assign,unused-ignore]
        pytest.ExceptionInfo.fill_unfilled = fill_unfilled  # type: ignore[method-assign]

    _installed.append(restore)


def _in_hypothesis() -> bool:
    try:
        from hypothesis.control import currently_in_test_context
    except ImportError:
        return False
    return bool(currently_in_test_context())


def pytest_configure(config: pytest.Config) -> None:
    if not _installed:
        _install()
    for label, value in CANARIES.items():
        GUARD.register(value, label)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _installed:
        _installed.pop()()


@pytest.fixture
def known_secrets() -> SecretGuard:
    """Register a test's own secret values: `known_secrets.register(value, "what it is")`."""
    return GUARD


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.excinfo is not None:
        GUARD.check_exception(call.excinfo.value, f"the exception the test's {call.when} raised")
    leaks = GUARD.take_leaks()
    if leaks:
        text = "a registered secret leaked:\n" + "\n".join(f"  - {leak}" for leak in dict.fromkeys(leaks))
        if report.failed:
            report.sections.append(("secret guard", text))
        else:
            report.outcome = "failed"
            report.longrepr = text
    return report

"""The secret guard (tests/security/secret_guard.py) sees what it promises, and fails the test for it.

Tests here leak on purpose and take the leaks from the guard themselves, so the guard's own check at
the end of the test finds nothing left; one subprocess run shows the failing report end to end.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prewarm.domain.registries import Keyring, RegistryAuth
from tests.security.secret_guard import CANARY_PASSWORD, GUARD, SecretGuard, base64_needles

ROOT = Path(__file__).resolve().parents[2]


def fresh_auth() -> RegistryAuth:
    return RegistryAuth(username="robot", password=f"pw-{uuid.uuid4().hex}", server="registry.example.com")


def labels() -> set[str]:
    return {leak.label for leak in GUARD.take_leaks()}


PASSWORD = "the password of a RegistryAuth for 'registry.example.com'"
AUTH = "the auth field of a RegistryAuth for 'registry.example.com'"


@pytest.fixture
def log() -> logging.Logger:
    logger = logging.getLogger("prewarm.guard-test")
    logger.setLevel(logging.DEBUG)  # a record below the effective level is never made, so never seen
    return logger


@given(st.binary(max_size=20), st.text(min_size=12, max_size=40), st.binary(max_size=20))
def test_a_secret_is_found_in_base64_of_any_text_around_it(before: bytes, secret: str, after: bytes) -> None:
    encoded = base64.b64encode(before + secret.encode() + after).decode()
    assert any(needle in encoded for needle in base64_needles(secret))


def test_a_password_built_into_a_registry_auth_is_caught_in_a_log_message_and_its_auth_in_an_extra(
    log: logging.Logger,
) -> None:
    # Given credentials built by the code under test
    auth = fresh_auth()
    # When their password reaches a message, and the auth field (base64 holding the password) an extra
    log.debug("pulling with %s", auth.password)
    first = GUARD.take_leaks()
    log.error("token refreshed", extra={"auth": auth.auth})
    # Then both lines are leaks, named without the value
    second = GUARD.take_leaks()
    assert {leak.label for leak in first} == {PASSWORD} and {leak.label for leak in second} == {PASSWORD, AUTH}
    assert all(auth.password not in str(leak) and auth.auth not in str(leak) for leak in first + second)


def test_a_secret_in_a_logged_exception_chain_of_a_logger_that_does_not_propagate_is_caught() -> None:
    auth = fresh_auth()
    quiet = logging.getLogger("prewarm.guard-test.quiet")
    quiet.propagate = False
    try:
        try:
            raise ValueError(f"bad token {auth.password}")
        except ValueError as inner:
            raise RuntimeError("refresh failed") from inner
    except RuntimeError:
        quiet.exception("refresh failed")
    assert labels() == {PASSWORD}


def test_a_dockerconfigjson_in_base64_is_caught_and_the_masked_repr_is_not(log: logging.Logger) -> None:
    auth = fresh_auth()
    document = json.dumps(Keyring([auth]).to_docker_config())
    log.info("credentials %r for %s", auth, auth.server)
    assert labels() == set()
    log.info("secret data %s", base64.b64encode(document.encode()).decode())
    assert labels() == {PASSWORD, AUTH}


def test_an_exception_caught_by_pytest_raises_is_checked() -> None:
    auth = fresh_auth()
    with pytest.raises(ValueError, match="refused"):
        raise ValueError(f"refused {auth.password}")
    assert labels() == {PASSWORD}


def test_values_a_test_registers_are_secrets_too(known_secrets: SecretGuard, log: logging.Logger) -> None:
    value = f"kube-token-{uuid.uuid4().hex}"
    known_secrets.register(value, "a bearer token")
    log.warning("Authorization: Bearer %s", value)
    assert labels() == {"a bearer token"}


LEAKY_TESTS = f'''
import logging
import pytest
CANARY = {CANARY_PASSWORD!r}

def test_logs_the_canary():
    logging.getLogger("leaky").warning("password is %s", CANARY)

def test_raises_with_the_canary():
    raise RuntimeError("login with " + CANARY + " failed")

def test_catches_it_with_pytest_raises():
    with pytest.raises(RuntimeError):
        raise RuntimeError(CANARY)

def test_clean():
    logging.getLogger("leaky").warning("nothing secret here")
'''


def test_leaking_tests_fail_with_a_report_naming_the_secret_but_not_showing_it(tmp_path: Path) -> None:
    # Given a test module that leaks the canary three ways, and one that does not
    (tmp_path / "test_leaky.py").write_text(LEAKY_TESTS)
    # When pytest runs it with the guard
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.security.secret_guard", "-p", "no:cacheprovider",
         "-rf", "test_leaky.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    # Then the three leaking tests fail, the clean one passes, and the guard names where each leak was
    out = run.stdout
    assert "3 failed, 1 passed" in out, out
    assert "canary registry password appeared in a log line of 'leaky' at WARNING" in out
    assert "canary registry password appeared in an exception caught by pytest.raises (RuntimeError)" in out
    assert "canary registry password appeared in the exception the test's call raised (RuntimeError)" in out

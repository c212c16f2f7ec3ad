"""The refresh_ecr_credentials handler: configuration sources, metrics, failure, and no token in any log."""

from __future__ import annotations

import base64
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from prewarm import bootstrap
from prewarm.adapters.secrets import read_config_parameter
from prewarm.domain.refresh import CredentialsConfigError
from prewarm.services.credentials import CredentialRefreshError
from prewarm.services.ports import ClusterUnavailableError
from prewarm.settings import Settings
from prewarm_devtools.sam.events import LambdaContext
from prewarm_devtools.sam.template import create_table, load_template
from tests.support.cluster import FakeCluster
from tests.support.credentials import PASSWORD, REGION, FakeTokens
from tests.support.events import load_event
from tests.support.handlers import load_handler

CONTEXT = LambdaContext("test", REGION, "123456789012", memory_mb=512, timeout_s=60)

HOST = "111122223333.dkr.ecr.us-east-1.amazonaws.com"
CONFIG = {"registries": [{"account": "111122223333", "region": "us-east-1"}], "namespaces": ["team-*"]}


@pytest.fixture
def function(aws: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    for name, value in {"TABLE_NAME": "jobs", "SECRET_PREFIX": "prewarm/test", "POWERTOOLS_TRACE_DISABLED": "1",
                        "POWERTOOLS_METRICS_NAMESPACE": "Prewarm", "CREDENTIALS_CONFIG": json.dumps(CONFIG),
                        "CREDENTIALS_CONFIG_PARAMETER": ""}.items():
        monkeypatch.setenv(name, value)
    # Imported only now, as Lambda does, after the environment is set; if an earlier test imported it
    # first, its Metrics object read the namespace then.
    from prewarm.observability import metrics

    monkeypatch.setattr(metrics, "namespace", "Prewarm")
    bootstrap.reset()
    # The stack's table: the refresher reads the registered clusters from it (none here).
    create_table(boto3.client("dynamodb", region_name=REGION), load_template(), "jobs")
    cluster = FakeCluster()
    monkeypatch.setattr(bootstrap, "own_cluster", lambda *_: cluster)
    monkeypatch.setattr(bootstrap, "registry_tokens", lambda: FakeTokens(time.time))
    yield cluster
    monkeypatch.undo()
    bootstrap.reset()


class CurrentStdout:
    """Whatever `sys.stdout` is at the time of writing: capsys swaps it in only for the test's call."""

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


@pytest.fixture
def all_logs(function: FakeCluster, caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every logger at DEBUG; the Powertools handlers write to the stdout capsys reads."""
    from prewarm.observability import logger as powertools_logger

    handlers = {h for h in powertools_logger.handlers if isinstance(h, logging.StreamHandler)}
    streams = {h: h.stream for h in handlers}
    for h in handlers:
        h.stream = CurrentStdout()
    level = powertools_logger.log_level
    powertools_logger.setLevel("DEBUG")
    logging.getLogger("prewarm").setLevel(logging.DEBUG)
    caplog.set_level(logging.DEBUG)
    yield
    powertools_logger.setLevel(level)
    logging.getLogger("prewarm").setLevel(level)
    for h, stream in streams.items():
        h.stream = stream


def emf(stdout: str) -> dict[str, Any]:
    """The metrics of the run, from the EMF line Powertools prints."""
    for line in stdout.splitlines():
        if line.startswith("{") and "_aws" in (doc := json.loads(line)):
            values = {m["Name"]: doc[m["Name"]] for m in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
            return {name: v[0] if isinstance(v, list) and len(v) == 1 else v for name, v in values.items()}
    raise AssertionError("no metrics were printed")


@pytest.mark.usefixtures("all_logs")
def test_a_run_with_a_failing_namespace_logs_no_token_and_fails_after_writing_the_rest(
    function: FakeCluster, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given two target namespaces, one of which the API cannot serve
    function.add_namespace("team-a")
    function.add_namespace("team-b")
    function.broken["team-b"] = ClusterUnavailableError("GET secrets: 503 ServiceUnavailable", status=503)
    handler = load_handler("refresh_ecr_credentials")
    # When the scheduled event arrives
    with pytest.raises(CredentialRefreshError) as raised:
        handler.lambda_handler(load_event("schedule_refresh_credentials"), CONTEXT)
    # Then team-a got its secret and the invocation failed naming team-b
    assert ("team-a", "prewarm-ecr") in function.secrets
    assert "namespace team-b: GET secrets: 503" in str(raised.value)
    # And the metrics say so
    out = capsys.readouterr().out
    metrics = emf(out)
    assert (metrics["NamespacesUpdated"], metrics["NamespacesFailed"]) == (1.0, 1.0)
    # And neither the password nor its base64 auth appears in any log line or in the error
    auth = base64.b64encode(f"AWS:{PASSWORD}".encode()).decode()
    everything = out + caplog.text + "".join(repr(r.__dict__) for r in caplog.records) + str(raised.value)
    assert "credentials refreshed" in out  # the run did log
    assert PASSWORD not in everything and auth not in everything
    # And the token was really written, so the absence above means something
    stored = boto3.client("secretsmanager", region_name=REGION).get_secret_value(
        SecretId=f"prewarm/test/registry/{HOST}")["SecretString"]
    assert PASSWORD in stored


def test_successful_run_returns_each_namespace_and_emits_seconds_to_earliest_expiry(
    function: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    function.add_namespace("team-a")
    function.add_namespace("kube-system")
    summary = load_handler("refresh_ecr_credentials").lambda_handler(
        load_event("schedule_refresh_credentials"), CONTEXT)
    assert summary["namespaces"] == [{"namespace": "team-a", "outcome": "created", "reason": "secret does not exist",
                                      "service_accounts_patched": ["default"], "service_accounts_missing": []}]
    assert summary["registries"] == [{"host": HOST, "outcome": "created", "reason": ""}]
    seconds = emf(capsys.readouterr().out)["SecondsToEarliestExpiry"]
    assert 12 * 3600 - 60 < seconds <= 12 * 3600


def test_without_configuration_the_run_does_nothing_and_reports_zero(
    function: FakeCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CREDENTIALS_CONFIG", "")
    summary = load_handler("refresh_ecr_credentials").lambda_handler(
        load_event("schedule_refresh_credentials"), CONTEXT)
    assert summary == {"registries": [], "namespaces": [], "errors": []}
    # No expiry is emitted: the expiry alarm treats missing data as fine
    assert emf(capsys.readouterr().out) == {"NamespacesUpdated": 0, "NamespacesSkipped": 0, "NamespacesFailed": 0}


@pytest.mark.usefixtures("aws")
def test_configuration_parameter_wins_over_the_inline_json() -> None:
    ssm = boto3.client("ssm", region_name=REGION)
    ssm.put_parameter(Name="/prewarm/credentials", Type="SecureString",
                      Value=json.dumps({"registries": [{"public": True}]}))
    config = Settings.from_env({"TABLE_NAME": "jobs", "CREDENTIALS_CONFIG": json.dumps(CONFIG),
                                "CREDENTIALS_CONFIG_PARAMETER": "/prewarm/credentials"}
                               ).credentials_config(read_config_parameter)
    assert config is not None and [r.host for r in config.registries] == ["public.ecr.aws"]


def test_invalid_inline_configuration_names_the_variable_and_field() -> None:
    with pytest.raises(CredentialsConfigError, match=r"^CREDENTIALS_CONFIG: registries\[0\]\.account"):
        Settings.from_env({"TABLE_NAME": "jobs", "CREDENTIALS_CONFIG": json.dumps({"registries": [{"account": "1"}]})}
                          ).credentials_config(read_config_parameter)

"""`refresh_credentials` against an in-memory cluster, token source and credential store."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.services.credentials import CredentialRefreshError, Outcome, RefreshReport, refresh_credentials
from prewarm.services.ports import ClusterAuthError, ClusterUnavailableError
from tests.support.clock import HOUR, T0, Clock
from tests.support.cluster import FakeCluster
from tests.support.cluster_directory import clusters_of
from tests.support.credentials import FakeCredentialStore, FakeTokens, config, outcomes

HOST = "111122223333.dkr.ecr.us-east-1.amazonaws.com"


class Run:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.cluster = FakeCluster()
        self.tokens = FakeTokens(clock)
        self.store = FakeCredentialStore()

    def __call__(self, **fields: Any) -> RefreshReport:
        return refresh_credentials(config(**fields), clusters_of(None, self.cluster), self.tokens, self.store,
                                   clock=self.clock)


@pytest.fixture
def run(clock: Clock) -> Run:
    return Run(clock)


def test_secret_is_created_then_skipped_while_fresh_then_refreshed_after_half_life(run: Run) -> None:
    run.cluster.add_namespace("team-a")
    # Given a first run: the secret is created
    assert outcomes(run()) == {"team-a": "created"}
    first = run.cluster.secrets[("team-a", "prewarm-ecr")]
    # When a run comes 5 hours later, the secret is fresh: nothing is written, no token is asked for
    run.clock.now = T0 + 5 * HOUR
    report = run()
    assert outcomes(report) == {"team-a": "skipped-fresh"}
    assert run.cluster.secrets[("team-a", "prewarm-ecr")] == first
    assert run.tokens.calls == [HOST]
    # When a run comes past half the token's lifetime, it is refreshed with a new token
    run.clock.now = T0 + 6 * HOUR
    assert outcomes(run()) == {"team-a": "refreshed"}
    refreshed = run.cluster.secrets[("team-a", "prewarm-ecr")]
    assert refreshed["metadata"]["annotations"]["prewarm.dev/issued-at"] == "2026-01-01T06:00:00Z"
    assert refreshed["metadata"]["annotations"]["prewarm.dev/expires-at"] == "2026-01-01T18:00:00Z"
    assert run.tokens.calls == [HOST, HOST]


def test_namespaces_are_chosen_by_wildcard_exclude_and_label_selector_sent_to_the_server(run: Run) -> None:
    for name, team in (("team-a", "a"), ("team-b", "b"), ("team-x-sandbox", "a"), ("other", "a")):
        run.cluster.add_namespace(name, team=team)
    report = run(namespaces={"include": ["team-*"], "exclude": ["*-sandbox"],
                             "labelSelector": {"matchLabels": {"team": "a"}}})
    assert outcomes(report) == {"team-a": "created"}
    assert run.cluster.selectors == ["team=a"]


def test_conflict_between_read_and_replace_is_read_again_and_retried(run: Run) -> None:
    run.cluster.add_namespace("team-a")
    run()
    run.clock.now = T0 + 7 * HOUR
    # Given someone else updates the secret (a label) right after the refresher read it
    changed: list[str] = []

    def touch(ns: str, name: str) -> None:
        if not changed and name == "prewarm-ecr":
            secret = run.cluster.secrets[(ns, name)]
            secret["metadata"]["labels"]["touched"] = "yes"
            secret["metadata"]["resourceVersion"] = "999"
            changed.append(name)

    run.cluster.before_write = touch
    # When the refresher runs
    report = run()
    # Then the first replace hit a conflict, the secret was re-read and replaced, keeping the new label
    assert outcomes(report) == {"team-a": "refreshed"}
    secret = run.cluster.secrets[("team-a", "prewarm-ecr")]
    assert secret["metadata"]["labels"]["touched"] == "yes"
    assert secret["metadata"]["annotations"]["prewarm.dev/issued-at"] == "2026-01-01T07:00:00Z"


def test_secret_created_by_another_run_meanwhile_is_read_and_found_fresh(run: Run) -> None:
    run.cluster.add_namespace("team-a")
    other = Run(run.clock)
    other.cluster = run.cluster
    raced: list[bool] = []

    def create_first(ns: str, name: str) -> None:
        if not raced:
            raced.append(True)
            run.cluster.before_write = None
            other()  # a concurrent refresher wins the create

    run.cluster.before_write = create_first
    assert outcomes(run()) == {"team-a": "skipped-fresh"}


def test_failing_namespace_does_not_stop_the_others_and_the_run_fails_after_all(run: Run) -> None:
    for name in ("a", "b", "c"):
        run.cluster.add_namespace(name)
    run.cluster.broken["b"] = ClusterAuthError('secrets is forbidden: User "refresher" cannot get secrets in "b"',
                                              status=403, reason="Forbidden")
    report = run()
    assert outcomes(report) == {"a": "created", "b": "failed", "c": "created"}
    assert report.metrics(T0) == {"NamespacesUpdated": 2, "NamespacesSkipped": 0, "NamespacesFailed": 1,
                                  "SecondsToEarliestExpiry": 12 * HOUR}
    with pytest.raises(CredentialRefreshError) as raised:
        report.raise_for_failures()
    assert str(raised.value).startswith("1 credential refresh failure(s): namespace b: ")
    assert "forbidden" in str(raised.value)


def test_secret_not_managed_by_prewarm_is_never_overwritten(run: Run) -> None:
    run.cluster.add_namespace("team-a")
    theirs = {"metadata": {"name": "prewarm-ecr", "namespace": "team-a", "resourceVersion": "5"},
              "type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "e30="}}
    run.cluster.secrets[("team-a", "prewarm-ecr")] = theirs
    report = run()
    assert outcomes(report) == {"team-a": "failed"}
    assert "not managed by prewarm" in report.namespaces[0].reason
    assert run.cluster.secrets[("team-a", "prewarm-ecr")] == theirs
    assert run.cluster.writes == []


def test_service_accounts_are_patched_once_and_keep_existing_entries(run: Run) -> None:
    run.cluster.add_namespace("team-a", accounts=("default", "builder"))
    run.cluster.service_accounts[("team-a", "builder")]["imagePullSecrets"] = [{"name": "regcred"}]
    # Given a first run patches both accounts
    report = run(serviceAccounts=["default", "builder", "absent"])
    assert report.namespaces[0].service_accounts_patched == ["default", "builder"]
    assert report.namespaces[0].service_accounts_missing == ["absent"]
    assert run.cluster.service_accounts[("team-a", "builder")]["imagePullSecrets"] == [
        {"name": "regcred"}, {"name": "prewarm-ecr"}]
    patches = [w for w in run.cluster.writes if w[0] == "patch"]
    # When it runs again
    again = run(serviceAccounts=["default", "builder", "absent"])
    # Then nothing is patched: the secret is already listed
    assert again.namespaces[0].service_accounts_patched == []
    assert [w for w in run.cluster.writes if w[0] == "patch"] == patches
    assert run.cluster.service_accounts[("team-a", "default")]["imagePullSecrets"] == [{"name": "prewarm-ecr"}]


def test_service_account_changed_meanwhile_is_re_read_so_no_entry_is_lost(run: Run) -> None:
    run.cluster.add_namespace("team-a")

    def add_theirs(ns: str, name: str) -> None:
        account = run.cluster.service_accounts.get((ns, name))
        if account is not None and "imagePullSecrets" not in account:
            account["imagePullSecrets"] = [{"name": "theirs"}]
            account["metadata"]["resourceVersion"] = "555"

    run.cluster.before_write = add_theirs
    run()
    assert run.cluster.service_accounts[("team-a", "default")]["imagePullSecrets"] == [
        {"name": "theirs"}, {"name": "prewarm-ecr"}]


def test_a_service_account_patch_failure_fails_the_namespace_and_says_the_secret_was_written(run: Run) -> None:
    run.cluster.add_namespace("team-a")

    def forbid_patch(ns: str, name: str) -> None:
        if name == "default":
            raise ClusterAuthError("serviceaccounts is forbidden", status=403, reason="Forbidden")

    run.cluster.before_write = forbid_patch
    report = run()
    assert outcomes(report) == {"team-a": "failed"}
    assert report.namespaces[0].reason.startswith("secret created, but service account not updated: ")
    assert ("team-a", "prewarm-ecr") in run.cluster.secrets


def test_empty_service_accounts_patch_nothing(run: Run) -> None:
    run.cluster.add_namespace("team-a")
    run(serviceAccounts=[])
    assert [w[0] for w in run.cluster.writes] == ["create"]


def test_agent_copies_are_written_per_host_and_kept_while_fresh(run: Run) -> None:
    fields = {"registries": [{"account": "111122223333", "region": "us-east-1", "extraHosts": ["cache.example.com"]}]}
    report = run(**fields)
    assert {r.host: r.outcome for r in report.registries} == {HOST: Outcome.CREATED,
                                                               "cache.example.com": Outcome.CREATED}
    assert run.store.saved[HOST].hosts == (HOST, "cache.example.com")
    run.clock.now = T0 + HOUR
    again = run(**fields)
    assert {r.outcome for r in again.registries} == {Outcome.FRESH}
    assert run.store.writes == [HOST, "cache.example.com"]


def test_without_namespaces_only_agent_copies_are_written(clock: Clock) -> None:
    tokens, store = FakeTokens(clock), FakeCredentialStore()
    cfg = config(namespaces=None)
    report = refresh_credentials(cfg, None, tokens, store, clock=clock)
    assert report.namespaces == [] and store.writes == [HOST]


def test_token_failure_fails_the_namespaces_that_need_it_and_is_asked_once(run: Run) -> None:
    for name in ("a", "b"):
        run.cluster.add_namespace(name)
    run.tokens.failing[HOST] = "sts:AssumeRole: AccessDenied: not authorized"
    report = run()
    assert outcomes(report) == {"a": "failed", "b": "failed"}
    assert report.namespaces[0].reason == f"cannot get a token for {HOST}: sts:AssumeRole: AccessDenied: not authorized"
    assert [r.outcome for r in report.registries] == [Outcome.FAILED]
    assert run.tokens.calls == [HOST]
    assert "SecondsToEarliestExpiry" not in report.metrics(T0)


def test_listing_namespaces_failing_is_reported_after_the_agent_copies(run: Run) -> None:
    def broken(label_selector: str | None = None) -> list[dict[str, Any]]:
        raise ClusterUnavailableError("GET /api/v1/namespaces: 503", status=503)

    run.cluster.list_namespaces = broken  # type: ignore[method-assign]
    report = run()
    assert run.store.writes == [HOST]
    assert report.errors == ["cannot list namespaces: GET /api/v1/namespaces: 503"]
    with pytest.raises(CredentialRefreshError, match="cannot list namespaces"):
        report.raise_for_failures()


def test_earliest_expiry_covers_kept_and_written_credentials(run: Run) -> None:
    run.cluster.add_namespace("old")
    run()
    run.cluster.add_namespace("new")
    run.clock.now = T0 + 2 * HOUR
    report = run()
    assert outcomes(report) == {"new": "created", "old": "skipped-fresh"}
    assert report.earliest_expiry() == T0 + 12 * HOUR
    assert report.metrics(run.clock.now)["SecondsToEarliestExpiry"] == 10 * HOUR

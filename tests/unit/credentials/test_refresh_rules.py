"""The pure refresh rules: namespace matching, the half-life decision, and the secret written."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from prewarm.domain.kubernetes import format_time
from prewarm.domain.refresh import (
    Action,
    NamespaceTargets,
    RegistryToken,
    decide,
    image_pull_secrets_with,
    parse_time,
    pull_secret,
    registry_secret_document,
    registry_secret_name,
    select_namespaces,
    stored_token,
    stored_token_is_fresh,
)
from prewarm.domain.registries import Keyring
from tests.support.clock import HOUR, T0
from tests.support.cluster import make_namespace
from tests.support.credentials import PASSWORD

HOST = "111122223333.dkr.ecr.us-east-1.amazonaws.com"


def targets(**fields: Any) -> NamespaceTargets:
    return NamespaceTargets.model_validate(fields)


def token(issued_at: float = T0, hosts: tuple[str, ...] = (HOST,), lifetime: float = 12 * HOUR) -> RegistryToken:
    return RegistryToken.for_hosts("AWS", PASSWORD, hosts, issued_at=issued_at, expires_at=issued_at + lifetime)


def written(issued_at: float = T0, hosts: tuple[str, ...] = (HOST,)) -> dict[str, Any]:
    secret: dict[str, Any] = pull_secret("prewarm-ecr", "team-a", [token(issued_at, hosts)])
    secret["metadata"]["resourceVersion"] = "7"
    return secret


# -- namespaces ------------------------------------------------------------------------------------

ALL = [make_namespace("default"), make_namespace("kube-system"), make_namespace("team-a", team="a"),
       make_namespace("team-b", team="b"), make_namespace("team-sandbox-1", team="a"), make_namespace("ml-01"),
       make_namespace("ml-100"), make_namespace("team-gone", "Terminating", team="a")]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ["default", "kube-system", "ml-01", "ml-100", "team-a", "team-b", "team-sandbox-1"]),
        ({"include": ["team-*"]}, ["team-a", "team-b", "team-sandbox-1"]),
        ({"include": ["team-*"], "exclude": ["team-sandbox-*"]}, ["team-a", "team-b"]),
        ({"include": ["ml-??"]}, ["ml-01"]),
        ({"include": ["default", "ml-?*"]}, ["default", "ml-01", "ml-100"]),
        ({"exclude": ["kube-*", "default"]}, ["ml-01", "ml-100", "team-a", "team-b", "team-sandbox-1"]),
        ({"labelSelector": {"matchLabels": {"team": "a"}}}, ["team-a", "team-sandbox-1"]),
        ({"include": ["team-?"], "labelSelector": {"matchExpressions": [{"key": "team", "operator": "In",
                                                                           "values": ["a", "b"]}]}},
         ["team-a", "team-b"]),
        ({"labelSelector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]},
          "exclude": ["kube-*"]}, ["default", "ml-01", "ml-100"]),
    ],
)
def test_namespaces_are_matched_by_wildcard_exclude_and_labels(fields: dict[str, Any], expected: list[str]) -> None:
    assert select_namespaces(ALL, targets(**fields)) == expected


def test_terminating_namespaces_are_never_targets() -> None:
    # Given a namespace being deleted that matches every rule
    chosen = select_namespaces(ALL, targets(include=["team-gone"]))
    # Then it is left out: the API refuses new content there
    assert chosen == []


def test_wildcards_match_whole_names_only() -> None:
    assert select_namespaces([make_namespace("xteam-a"), make_namespace("team-ab")], targets(include=["team-?"])) == []


# -- the decision ----------------------------------------------------------------------------------


def test_missing_secret_is_created() -> None:
    assert decide(None, [HOST], T0).action is Action.CREATE


def test_fresh_secret_is_kept_until_half_its_lifetime_then_refreshed() -> None:
    # Given a secret written at T0 with a 12-hour token
    secret = written(T0)
    # When the clock is just before, at, and after the half-life (6 hours)
    before, at = decide(secret, [HOST], T0 + 6 * HOUR - 1), decide(secret, [HOST], T0 + 6 * HOUR)
    # Then it is kept before, with the token's expiry, and refreshed from the half-life on
    assert before.action is Action.KEEP and before.expires_at == T0 + 12 * HOUR
    assert at.action is Action.REFRESH and "past half its lifetime" in at.reason


def test_secret_issued_in_the_future_is_refreshed() -> None:
    # A clock that went backwards (or a hand-edited annotation) must not pin a secret forever.
    assert decide(written(T0 + HOUR), [HOST], T0).action is Action.REFRESH


def test_secret_without_prewarm_label_is_refused_with_a_clear_reason() -> None:
    secret = written()
    del secret["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    decision = decide(secret, [HOST], T0)
    assert decision.action is Action.REFUSE
    assert "not managed by prewarm" in decision.reason and "secretName" in decision.reason


def test_managed_secret_of_another_type_is_refused_because_type_is_immutable() -> None:
    secret = written()
    secret["type"] = "Opaque"
    decision = decide(secret, [HOST], T0)
    assert decision.action is Action.REFUSE and "cannot change" in decision.reason


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: s["metadata"]["annotations"].pop("prewarm.dev/expires-at"), "annotations"),
        (lambda s: s["metadata"]["annotations"].update({"prewarm.dev/issued-at": "yesterday"}), "annotations"),
        (lambda s: s["metadata"]["annotations"].update({"prewarm.dev/issued-at": "2026-01-01T00:00:00"}),
         "annotations"),
        (lambda s: s["data"].update({".dockerconfigjson": "not base64!"}), "not a valid docker config"),
        (lambda s: s["data"].update({".dockerconfigjson": base64.b64encode(b"[]").decode()}),
         "not a valid docker config"),
        (lambda s: s.pop("data"), "not a valid docker config"),
    ],
)
def test_invalid_managed_secret_is_refreshed(mutate: Any, reason: str) -> None:
    secret = written()
    mutate(secret)
    decision = decide(secret, [HOST], T0)
    assert decision.action is Action.REFRESH and reason in decision.reason


def test_changed_registries_refresh_a_fresh_secret_and_say_what_changed() -> None:
    decision = decide(written(), [HOST, "public.ecr.aws"], T0)
    assert decision.action is Action.REFRESH
    assert decision.reason == "registries changed: adds public.ecr.aws"


# -- the secret --------------------------------------------------------------------------------------


def test_pull_secret_is_a_labelled_dockerconfigjson_with_auth_for_every_host() -> None:
    # Given a token for a registry and an alias host
    secret = pull_secret("prewarm-ecr", "team-a", [token(hosts=(HOST, "cache.example.com"))])
    # Then it is a dockerconfigjson secret with username, password and auth per host
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "prewarm"}
    assert secret["metadata"]["annotations"] == {"prewarm.dev/issued-at": "2026-01-01T00:00:00Z",
                                                 "prewarm.dev/expires-at": "2026-01-01T12:00:00Z"}
    document = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    auth = base64.b64encode(f"AWS:{PASSWORD}".encode()).decode()
    assert document == {"auths": {h: {"username": "AWS", "password": PASSWORD, "auth": auth}
                                  for h in (HOST, "cache.example.com")}}
    # And the kubelet's keyring finds it for an image of the registry
    assert Keyring.from_docker_config(document).lookup(f"{HOST}/app:1")[0].password == PASSWORD


def test_replacing_keeps_other_labels_and_annotations_and_carries_the_resource_version() -> None:
    existing = written()
    existing["metadata"]["labels"]["team"] = "a"
    existing["metadata"]["annotations"]["note"] = "kept"
    secret = pull_secret("prewarm-ecr", "team-a", [token(T0 + 7 * HOUR)], existing)
    assert secret["metadata"]["resourceVersion"] == "7"
    assert secret["metadata"]["labels"]["team"] == "a" and secret["metadata"]["annotations"]["note"] == "kept"
    assert secret["metadata"]["annotations"]["prewarm.dev/issued-at"] == "2026-01-01T07:00:00Z"


def test_a_secret_of_several_registries_records_the_earliest_expiry() -> None:
    secret = pull_secret("s", "ns", [token(T0, (HOST,)), token(T0, ("public.ecr.aws",), lifetime=HOUR)])
    assert secret["metadata"]["annotations"]["prewarm.dev/expires-at"] == format_time(T0 + HOUR)


def test_service_account_gets_the_secret_appended_and_keeps_existing_entries() -> None:
    account = {"metadata": {"name": "default"}, "imagePullSecrets": [{"name": "regcred"}]}
    assert image_pull_secrets_with(account, "prewarm-ecr") == [{"name": "regcred"}, {"name": "prewarm-ecr"}]
    assert image_pull_secrets_with({"metadata": {"name": "default"}}, "prewarm-ecr") == [{"name": "prewarm-ecr"}]


def test_service_account_that_already_lists_the_secret_needs_no_patch() -> None:
    account = {"imagePullSecrets": [{"name": "prewarm-ecr"}, {"name": "regcred"}]}
    assert image_pull_secrets_with(account, "prewarm-ecr") is None


# -- the agents' copy ----------------------------------------------------------------------------------


def test_registry_secret_names_replace_a_port_colon() -> None:
    assert registry_secret_name("prewarm/prod", HOST) == f"prewarm/prod/registry/{HOST}"
    assert registry_secret_name("p", "registry.local:5000") == "p/registry/registry.local_5000"


def test_registry_document_round_trips_to_its_metadata_and_freshness() -> None:
    document = json.loads(json.dumps(registry_secret_document(token())))
    assert document["expiresAt"] == "2026-01-01T12:00:00Z"
    stored = stored_token(document)
    assert stored is not None and stored.hosts == {HOST}
    assert stored_token_is_fresh(stored, [HOST], T0 + 5 * HOUR)
    assert not stored_token_is_fresh(stored, [HOST], T0 + 6 * HOUR)
    assert not stored_token_is_fresh(stored, [HOST, "cache.example.com"], T0)


def test_a_document_without_times_is_not_a_stored_token() -> None:
    assert stored_token({"auths": {}}) is None
    assert stored_token({"auths": {HOST: {"auth": "%%"}}, "issuedAt": "2026-01-01T00:00:00Z",
                         "expiresAt": "2026-01-01T12:00:00Z"}) is None


def test_times_are_rfc3339_utc_and_need_a_zone() -> None:
    assert format_time(T0 + 0.9) == "2026-01-01T00:00:00Z"
    assert parse_time("2026-01-01T01:00:00+01:00") == T0
    assert parse_time("2026-01-01T00:00:00") is None and parse_time(12) is None


def test_token_repr_hides_the_password() -> None:
    assert PASSWORD not in repr(token()) and PASSWORD not in str(token())

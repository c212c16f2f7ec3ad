"""Label and field selectors on lists, through the typed client, with the API server's grammar and errors."""

# The typed client declares every field optional and takes models, not dicts: these tests pass
# the API's JSON and read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient, ApiException, CoreV1Api

from prewarm_devtools.kubeapi import KubeApiServer
from tests.support.kube import node, pod, status_of

pytestmark = pytest.mark.integration

LABELS = {
    "n1": {"env": "prod", "tier": "web", "rank": "5"},
    "n2": {"env": "dev", "tier": "web", "rank": "10"},
    "n3": {"env": "prod", "tier": "db"},
    "n4": {},
    "n5": {"env": "staging", "example.com/gpu": ""},
}


@pytest.fixture(scope="module")
def v1(kube_api_module: KubeApiServer) -> Iterator[CoreV1Api]:
    kube_api_module.seed_objects([node(name, labels) for name, labels in LABELS.items()])
    kube_api_module.seed_objects([node("cordoned", unschedulable=True)])
    kube_api_module.seed_objects(
        [
            pod("web-1", "shop", "n1"),
            pod("web-2", "shop", "n2"),
            pod("api-1", "backend", "n1", phase="Pending"),
            pod("batch-1", "backend", "n3", phase="Succeeded"),
        ]
    )
    with ApiClient(kube_api_module.client_configuration()) as client:
        yield CoreV1Api(client)


def node_names(v1: CoreV1Api, **kwargs: str) -> list[str]:
    return sorted(n.metadata.name for n in v1.list_node(**kwargs).items if n.metadata.name != "cordoned")


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", ["n1", "n2", "n3", "n4", "n5"]),
        ("env=prod", ["n1", "n3"]),
        ("env==prod", ["n1", "n3"]),
        ("env!=prod", ["n2", "n4", "n5"]),
        ("env in (prod,dev)", ["n1", "n2", "n3"]),
        ("env notin (prod)", ["n2", "n4", "n5"]),
        ("tier", ["n1", "n2", "n3"]),
        ("!tier", ["n4", "n5"]),
        ("env=prod,tier=web", ["n1"]),
        ("  env = prod ,  tier in ( web , db )  ", ["n1", "n3"]),
        ("rank>6", ["n2"]),
        ("rank<6", ["n1"]),
        ("example.com/gpu", ["n5"]),
        ("example.com/gpu=", ["n5"]),
        ("env in (prod),!tier", []),
        ("env in (prod,),tier", ["n1", "n3"]),
    ],
)
def test_label_selector_forms_select_the_matching_nodes(v1: CoreV1Api, selector: str, expected: list[str]) -> None:
    # Given nodes with assorted labels, When listing with the selector, Then exactly the matching ones come back
    assert node_names(v1, label_selector=selector) == expected


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("env in prod", "unable to parse requirement: found 'prod' expected: '('"),
        ("env=prod,", "found '', expected: identifier after ','"),
        ("=prod", "found '=', expected: !, identifier, or 'end of string'"),
        ("env prod", "unable to parse requirement: found 'prod', expected: in, notin, =, ==, !=, gt, lt"),
        ("env in (prod", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("env=prod tier", "found 'tier', expected: ',' or 'end of string'"),
        (
            "rank>abc",
            'unable to parse requirement: values[0]: Invalid value: "abc": '
            "for 'Gt', 'Lt' operators, the value must be an integer",
        ),
    ],
)
def test_malformed_label_selector_is_a_bad_request(v1: CoreV1Api, selector: str, message: str) -> None:
    # When listing with a selector that does not parse
    with pytest.raises(ApiException) as raised:
        v1.list_node(label_selector=selector)
    # Then the API answers 400 BadRequest with the parser's message
    status = status_of(raised.value)
    assert (raised.value.status, status["reason"], status["message"]) == (400, "BadRequest", message)


@pytest.mark.parametrize(
    ("selector", "start"),
    [
        ("-bad=x", 'unable to parse requirement: <nil>: Invalid value: "-bad": name part must consist of'),
        ("env=-x", 'unable to parse requirement: values[0][env]: Invalid value: "-x": a valid label must be'),
    ],
)
def test_invalid_label_key_or_value_is_a_bad_request(v1: CoreV1Api, selector: str, start: str) -> None:
    with pytest.raises(ApiException) as raised:
        v1.list_node(label_selector=selector)
    status = status_of(raised.value)
    assert raised.value.status == 400
    assert status["message"].startswith(start)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("metadata.name=n1", ["n1"]),
        ("metadata.name==n2", ["n2"]),
        ("metadata.name!=n1", ["n2", "n3", "n4", "n5"]),
        ("spec.unschedulable=false,metadata.name!=n5", ["n1", "n2", "n3", "n4"]),
    ],
)
def test_node_field_selectors(v1: CoreV1Api, selector: str, expected: list[str]) -> None:
    assert node_names(v1, field_selector=selector) == expected


def test_unschedulable_field_selector_finds_cordoned_nodes(v1: CoreV1Api) -> None:
    assert [n.metadata.name for n in v1.list_node(field_selector="spec.unschedulable=true").items] == ["cordoned"]


def test_field_and_label_selectors_combine(v1: CoreV1Api) -> None:
    assert node_names(v1, label_selector="env=prod", field_selector="metadata.name!=n1") == ["n3"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=n1", ["backend/api-1", "shop/web-1"]),
        ("spec.host=n1", ["backend/api-1", "shop/web-1"]),
        ("status.phase=Running", ["shop/web-1", "shop/web-2"]),
        ("status.phase!=Running,spec.nodeName=n3", ["backend/batch-1"]),
        ("metadata.namespace=backend", ["backend/api-1", "backend/batch-1"]),
        ("metadata.namespace!=backend,metadata.name=web-2", ["shop/web-2"]),
    ],
)
def test_pod_field_selectors_across_namespaces(v1: CoreV1Api, selector: str, expected: list[str]) -> None:
    pods = v1.list_pod_for_all_namespaces(field_selector=selector).items
    assert sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods) == expected


def test_pod_field_selector_within_a_namespace(v1: CoreV1Api) -> None:
    pods = v1.list_namespaced_pod("shop", field_selector="spec.nodeName=n1").items
    assert [p.metadata.name for p in pods] == ["web-1"]


@pytest.mark.parametrize(
    ("list_call", "selector", "message"),
    [
        ("list_node", "metadata.namespace=default", "field label not supported: metadata.namespace"),
        ("list_node", "spec.nodeName=n1", "field label not supported: spec.nodeName"),
        ("list_pod_for_all_namespaces", "spec.image=x", "field label not supported: spec.image"),
        (
            "list_service_account_for_all_namespaces",
            "spec.x=y",
            '"spec.x" is not a known field selector: only "metadata.name", "metadata.namespace"',
        ),
        ("list_node", "metadata.name", "invalid selector: 'metadata.name'; can't understand 'metadata.name'"),
    ],
)
def test_unsupported_or_malformed_field_selector_is_a_bad_request(
    v1: CoreV1Api, list_call: str, selector: str, message: str
) -> None:
    with pytest.raises(ApiException) as raised:
        getattr(v1, list_call)(field_selector=selector)
    status = status_of(raised.value)
    assert (raised.value.status, status["reason"], status["message"]) == (400, "BadRequest", message)

"""Server-side apply of custom resources: field managers, conflicts and `force`, merge by the CRD's
markers (an atomic map is one field; set and map lists merge item by item), and the `Update` managers
other writes record in managedFields."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes.client import ApiClient, ApiextensionsV1Api

from prewarm_cli.install.crds import custom_resource_definitions
from tests.support.kube import Answer, call

pytestmark = pytest.mark.integration

APPLY = "application/apply-patch+yaml"
JOBS = "/apis/prewarm.dev/v1alpha1/namespaces/default/imagepulljobs"


def install(client: ApiClient, *, atomic_selector: bool = True) -> None:
    (crd,) = [copy.deepcopy(c) for c in custom_resource_definitions() if c["spec"]["names"]["kind"] == "ImagePullJob"]
    if not atomic_selector:
        # As the CRD was before: the selector merged field by field
        del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["selector"][
            "x-kubernetes-map-type"]
    ApiextensionsV1Api(client).create_custom_resource_definition(crd)


def job(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "prewarm.dev/v1alpha1", "kind": "ImagePullJob",
            "metadata": {"name": "web", "namespace": "default"}, "spec": {"image": "nginx:1.27", **spec}}


def apply(client: ApiClient, manager: str, body: dict[str, Any], force: bool = False) -> Answer:
    query = [("fieldManager", manager), *([("force", "true")] if force else [])]
    return call(client, "PATCH", f"{JOBS}/web", query=query, body=json.dumps(body), content_type=APPLY)


def owners(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"].get("managedFields") or []}


def test_an_atomic_selector_is_one_field_two_appliers_cannot_merge(kube_client: ApiClient) -> None:
    install(kube_client)
    # Given team-a's apply of the job with node names
    created = apply(kube_client, "team-a", job(selector={"names": ["node-1"]}))
    assert created.status == 201, created.body
    # When team-b applies a label selector, Then it conflicts over the whole selector
    conflict = apply(kube_client, "team-b", job(selector={"matchLabels": {"pool": "general"}}))
    assert conflict.status == 409 and conflict.body["reason"] == "Conflict"
    assert conflict.body["message"] == 'Apply failed with 1 conflict: conflict with "team-a": .spec.selector'
    assert conflict.body["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "team-a"', "field": ".spec.selector"}]
    # And with force it takes the selector whole: names go, nothing is merged
    forced = apply(kube_client, "team-b", job(selector={"matchLabels": {"pool": "general"}}), force=True)
    assert forced.status == 200, forced.body
    assert forced.body["spec"]["selector"] == {"matchLabels": {"pool": "general"}}
    assert owners(forced.body) == {
        ("team-a", "Apply"): {"f:spec": {"f:image": {}}},
        ("team-b", "Apply"): {"f:spec": {"f:image": {}, "f:selector": {}}},
    }


def test_a_selector_merged_field_by_field_would_hold_names_and_labels_together(kube_client: ApiClient) -> None:
    install(kube_client, atomic_selector=False)
    assert apply(kube_client, "team-a", job(selector={"names": ["node-1"]})).status == 201
    # team-b's labels merge beside team-a's names: the CRD's rule refuses the result
    merged = apply(kube_client, "team-b", job(selector={"matchLabels": {"pool": "general"}}))
    assert merged.status == 422
    assert 'spec.selector: Invalid value: "object": names cannot be combined with matchLabels' in merged.body["message"]


def test_apply_removes_what_its_manager_stops_applying_and_keeps_what_others_own(kube_client: ApiClient) -> None:
    install(kube_client)
    apply(kube_client, "team-a", job(parallelism=2, pullSecrets=["regcred"]))
    apply(kube_client, "team-b", job(pullSecrets=["regcred"]))
    # When team-a applies without parallelism and pullSecrets
    again = apply(kube_client, "team-a", job())
    # Then parallelism goes, pullSecrets stays: team-b still applies it
    assert again.status == 200
    assert "parallelism" not in again.body["spec"] and again.body["spec"]["pullSecrets"] == ["regcred"]
    assert again.body["metadata"]["generation"] == 2


def test_an_apply_conflicts_with_the_writer_of_an_update(kube_client: ApiClient) -> None:
    install(kube_client)
    created = call(kube_client, "POST", JOBS, query=[("fieldManager", "deployer")], body=job(parallelism=2))
    assert created.status == 201
    entry = created.body["metadata"]["managedFields"][0]
    assert (entry["manager"], entry["operation"], entry["apiVersion"]) == ("deployer", "Update",
                                                                          "prewarm.dev/v1alpha1")
    assert entry["fieldsV1"]["f:spec"]["f:parallelism"] == {}
    conflict = apply(kube_client, "team-a", job(parallelism=5))
    assert conflict.status == 409
    assert conflict.body["message"] == (f'Apply failed with 1 conflict: conflict with "deployer" using '
                                        f'prewarm.dev/v1alpha1 at {entry["time"]}: .spec.parallelism')
    # The same value is no conflict: both own it
    shared = apply(kube_client, "team-a", job(parallelism=2))
    assert shared.status == 200
    assert {m for m, _ in owners(shared.body)} == {"deployer", "team-a"}


def test_apply_needs_a_field_manager(kube_client: ApiClient) -> None:
    install(kube_client)
    answer = call(kube_client, "PATCH", f"{JOBS}/web", body=json.dumps(job()), content_type=APPLY)
    assert answer.status == 422
    assert answer.body["message"] == ('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
                                      "required for apply patch")


def test_sets_and_map_lists_merge_item_by_item(kube_client: ApiClient) -> None:
    # A CRD of the test's own: a set of tags and a map list of ports, keyed by name
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "required": ["name"],
                            "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}}}}}}
    ApiextensionsV1Api(kube_client).create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.dev"},
        "spec": {"group": "example.dev", "scope": "Cluster", "names": {"kind": "Gadget", "plural": "gadgets"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}]}})

    def gadget(manager: str, **spec: Any) -> Answer:
        body = {"apiVersion": "example.dev/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": spec}
        return call(kube_client, "PATCH", "/apis/example.dev/v1/gadgets/g", query=[("fieldManager", manager)],
                    body=json.dumps(body), content_type=APPLY)

    gadget("a", tags=["x"], ports=[{"name": "http", "port": 80}])
    merged = gadget("b", tags=["y"], ports=[{"name": "https", "port": 443}])
    assert merged.body["spec"] == {"tags": ["x", "y"],
                                   "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]}
    assert owners(merged.body)[("b", "Apply")] == {"f:spec": {
        "f:tags": {'v:"y"': {}},
        "f:ports": {'k:{"name":"https"}': {".": {}, "f:name": {}, "f:port": {}}}}}
    conflict = gadget("b", ports=[{"name": "http", "port": 8080}])
    assert conflict.body["message"] == ('Apply failed with 1 conflict: conflict with "a": '
                                        '.spec.ports[name="http"].port')

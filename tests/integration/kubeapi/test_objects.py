"""Create, read, replace and delete, with the real registry's answers and errors."""

# The typed client declares every field optional and takes models, not dicts: these tests pass
# the API's JSON and read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

import base64
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, ApiException, CoreV1Api, V1Pod

from prewarm_devtools.kubeapi import KubeApiServer
from tests.support.kube import call, node, pod, status_of
from tests.support.kubectl import kubectl_on

pytestmark = pytest.mark.integration


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(name: str, secret_type: str = "Opaque", **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": secret_type, "data": data}


def test_create_answers_201_with_server_set_fields(kube_client: ApiClient) -> None:
    answer = call(kube_client, "POST", "/api/v1/nodes", body=node("n1", {"a": "b"}))
    assert answer.status == 201
    meta = answer.body["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and int(meta["resourceVersion"]) > 0
    assert answer.body["kind"] == "Node" and answer.body["apiVersion"] == "v1"


def test_resource_versions_increase_strictly_across_all_writes(core_v1: CoreV1Api) -> None:
    versions = [
        core_v1.create_node(node("n1")).metadata.resource_version,
        core_v1.create_namespace({"metadata": {"name": "team"}}).metadata.resource_version,
        core_v1.patch_node("n1", {"metadata": {"labels": {"x": "1"}}}).metadata.resource_version,
        core_v1.create_namespaced_service_account("team", {"metadata": {"name": "sa"}}).metadata.resource_version,
    ]
    as_ints = [int(v) for v in versions]
    assert as_ints == sorted(as_ints) and len(set(as_ints)) == 4
    assert int(core_v1.list_node().metadata.resource_version) >= as_ints[-1]


def test_creating_an_existing_name_is_409_already_exists(core_v1: CoreV1Api) -> None:
    core_v1.create_node(node("n1"))
    with pytest.raises(ApiException) as raised:
        core_v1.create_node(node("n1"))
    status = status_of(raised.value)
    assert raised.value.status == 409
    assert status["reason"] == "AlreadyExists"
    assert status["message"] == 'nodes "n1" already exists'
    assert status["details"] == {"name": "n1", "kind": "nodes"}


def test_reading_a_missing_object_is_404_not_found(core_v1: CoreV1Api) -> None:
    with pytest.raises(ApiException) as raised:
        core_v1.read_namespaced_secret("missing", "default")
    status = status_of(raised.value)
    assert (raised.value.status, status["reason"], status["message"]) == (
        404,
        "NotFound",
        'secrets "missing" not found',
    )
    assert status["details"] == {"name": "missing", "kind": "secrets"}


def test_replace_with_a_stale_resource_version_is_409_conflict(core_v1: CoreV1Api) -> None:
    # Given a node read, then changed by someone else
    stale = core_v1.create_node(node("n1"))
    core_v1.patch_node("n1", {"metadata": {"labels": {"changed": "yes"}}})
    # When replacing it from the stale copy
    stale.metadata.labels = {"mine": "yes"}
    with pytest.raises(ApiException) as raised:
        core_v1.replace_node("n1", stale)
    # Then the API refuses with the optimistic-concurrency conflict
    status = status_of(raised.value)
    assert raised.value.status == 409 and status["reason"] == "Conflict"
    assert status["message"] == (
        'Operation cannot be fulfilled on nodes "n1": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert core_v1.read_node("n1").metadata.labels == {"changed": "yes"}


def test_replace_with_the_current_resource_version_succeeds(core_v1: CoreV1Api) -> None:
    current = core_v1.create_node(node("n1"))
    current.metadata.labels = {"mine": "yes"}
    replaced = core_v1.replace_node("n1", current)
    assert replaced.metadata.labels == {"mine": "yes"}
    assert int(replaced.metadata.resource_version) > int(current.metadata.resource_version)


def test_replace_of_a_missing_object_is_404(kube_client: ApiClient) -> None:
    answer = call(kube_client, "PUT", "/api/v1/nodes/ghost", body=node("ghost"))
    assert (answer.status, answer.body["reason"]) == (404, "NotFound")


def test_replace_with_another_name_than_the_url_is_400(kube_client: ApiClient) -> None:
    call(kube_client, "POST", "/api/v1/nodes", body=node("n1"))
    answer = call(kube_client, "PUT", "/api/v1/nodes/n1", body=node("n2"))
    assert answer.status == 400
    assert answer.body["message"] == "the name of the object (n2) does not match the name on the URL (n1)"


def test_replace_of_the_main_resource_keeps_the_status(core_v1: CoreV1Api, kube_client: ApiClient) -> None:
    # Given a node with a status
    created = call(kube_client, "POST", "/api/v1/nodes", body={**node("n1"), "status": {"phase": "Running"}}).body
    # When its status is changed through the main resource, Then it is ignored, as on a real server
    created["status"] = {"phase": "Terminated"}
    replaced = call(kube_client, "PUT", "/api/v1/nodes/n1", body=created).body
    assert replaced["status"] == {"phase": "Running"}
    # And through the status subresource it applies
    status_update = core_v1.patch_node_status("n1", {"status": {"phase": "Terminated"}})
    assert status_update.status.phase == "Terminated"


def test_creating_a_pod_resets_its_status_to_pending(core_v1: CoreV1Api) -> None:
    created = core_v1.create_namespaced_pod("default", pod("web-1", "default", phase="Running"))
    assert created.status.phase == "Pending"
    assert created.spec.service_account_name == "default"
    assert created.spec.containers[0].image_pull_policy == "IfNotPresent"
    running = core_v1.patch_namespaced_pod_status("web-1", "default", {"status": {"phase": "Running"}})
    assert running.status.phase == "Running"


def test_a_pod_whose_service_account_is_missing_is_forbidden(core_v1: CoreV1Api) -> None:
    body = pod("web-1", "default")
    body["spec"]["serviceAccountName"] = "nobody"
    with pytest.raises(ApiException) as raised:
        core_v1.create_namespaced_pod("default", body)
    status = status_of(raised.value)
    assert raised.value.status == 403
    assert status["message"] == (
        'pods "web-1" is forbidden: error looking up service account default/nobody: serviceaccount "nobody" not found'
    )


def test_changing_a_pod_spec_is_forbidden_except_images(core_v1: CoreV1Api) -> None:
    core_v1.create_namespaced_pod("default", pod("web-1", "default"))
    new_image = {"spec": {"containers": [{"name": "app", "image": "registry.example/app:2.0"}]}}
    assert core_v1.patch_namespaced_pod("web-1", "default", new_image).spec.containers[0].image.endswith(":2.0")
    with pytest.raises(ApiException) as raised:
        core_v1.patch_namespaced_pod("web-1", "default", {"spec": {"nodeName": "elsewhere"}})
    status = status_of(raised.value)
    assert raised.value.status == 422
    assert status["message"].startswith('Pod "web-1" is invalid: spec: Forbidden: pod updates may not change fields')


def test_namespace_must_exist_for_a_namespaced_create(core_v1: CoreV1Api) -> None:
    with pytest.raises(ApiException) as raised:
        core_v1.create_namespaced_secret("nope", secret("s"))
    status = status_of(raised.value)
    assert (raised.value.status, status["message"]) == (404, 'namespaces "nope" not found')
    assert status["details"] == {"name": "nope", "kind": "namespaces"}


def test_namespace_in_the_body_must_match_the_url(kube_client: ApiClient) -> None:
    body = secret("s")
    body["metadata"]["namespace"] = "kube-system"
    answer = call(kube_client, "POST", "/api/v1/namespaces/default/secrets", body=body)
    assert (answer.status, answer.body["reason"]) == (400, "BadRequest")
    assert (
        answer.body["message"]
        == "the namespace of the provided object does not match the namespace sent on the request"
    )


def test_a_new_namespace_gets_its_default_service_account_and_name_label(core_v1: CoreV1Api) -> None:
    created = core_v1.create_namespace({"metadata": {"name": "team"}})
    assert created.status.phase == "Active"
    assert created.metadata.labels == {"kubernetes.io/metadata.name": "team"}
    assert core_v1.read_namespaced_service_account("default", "team").metadata.namespace == "team"


def test_generate_name_gets_a_random_suffix(kube_client: ApiClient) -> None:
    body = {"metadata": {"generateName": "pull-"}, "type": "Opaque"}
    names = {
        call(kube_client, "POST", "/api/v1/namespaces/default/secrets", body=body).body["metadata"]["name"]
        for _ in range(5)
    }
    assert len(names) == 5
    assert all(name.startswith("pull-") and len(name) == len("pull-") + 5 for name in names)


def test_missing_name_is_422_invalid(kube_client: ApiClient) -> None:
    answer = call(kube_client, "POST", "/api/v1/nodes", body={"metadata": {}})
    assert (answer.status, answer.body["reason"]) == (422, "Invalid")
    assert (
        answer.body["message"] == 'Node "" is invalid: metadata.name: Required value: name or generateName is required'
    )


def test_bad_name_is_422_naming_the_rule(kube_client: ApiClient) -> None:
    answer = call(kube_client, "POST", "/api/v1/namespaces", body={"metadata": {"name": "Not_Valid"}})
    assert answer.status == 422
    assert answer.body["message"].startswith(
        'Namespace "Not_Valid" is invalid: metadata.name: Invalid value: "Not_Valid": a lowercase RFC 1123 label'
    )


def test_resource_version_on_create_is_refused(kube_client: ApiClient) -> None:
    body = node("n1")
    body["metadata"]["resourceVersion"] = "5"
    answer = call(kube_client, "POST", "/api/v1/nodes", body=body)
    assert (answer.status, answer.body.get("reason")) == (500, None)
    assert answer.body["message"] == "resourceVersion should not be set on objects to be created"


def test_a_resource_version_on_create_is_refused_by_storage_after_validation_as_kubectl_shows(
    tmp_path: Path,
) -> None:
    # etcd3's store refuses it (storage.ErrResourceVersionSetOnCreate), after validation and admission and
    # never on a dry run, and only when it parses as a non-zero version.
    def config_map(name: str, rv: str) -> str:
        return json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": name, "resourceVersion": rv}, "data": {"a": "b"}})

    with KubeApiServer(tls=True) as api:
        kubectl = kubectl_on(api, tmp_path)
        collection = "/api/v1/namespaces/default/configmaps"

        def create(body: str, query: str = "") -> subprocess.CompletedProcess[str]:
            return kubectl("create", "--raw", collection + query, "-f", "-", stdin=body)

        # A plain create: 500, in the store's words
        refused = create(config_map("c1", "5"))
        assert refused.returncode != 0
        assert "Error from server: resourceVersion should not be set on objects to be created" in refused.stderr
        # An invalid object: validation speaks first
        invalid = create(config_map("Not_Valid", "5"))
        assert invalid.stderr.startswith('The ConfigMap "Not_Valid" is invalid: metadata.name: Invalid value')
        # A dry run never reaches the store: it answers the object
        dry = create(config_map("c2", "5"), "?dryRun=All")
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["metadata"]["name"] == "c2"
        assert api.get_object("configmaps", "c2", "default") is None
        # "0" is no version: created
        assert create(config_map("c3", "0")).returncode == 0
        assert api.get_object("configmaps", "c3", "default") is not None


def test_dockerconfigjson_secret_without_the_key_is_422(core_v1: CoreV1Api) -> None:
    with pytest.raises(ApiException) as raised:
        core_v1.create_namespaced_secret("default", secret("regcred", "kubernetes.io/dockerconfigjson"))
    status = status_of(raised.value)
    assert raised.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"] == 'Secret "regcred" is invalid: data[.dockerconfigjson]: Required value'
    assert status["details"] == {
        "name": "regcred",
        "kind": "Secret",
        "causes": [{"reason": "FieldValueRequired", "message": "Required value", "field": "data[.dockerconfigjson]"}],
    }


def test_dockerconfigjson_secret_that_is_not_json_is_422(kube_client: ApiClient) -> None:
    body = secret("regcred", "kubernetes.io/dockerconfigjson", **{".dockerconfigjson": b64("{not json")})
    answer = call(kube_client, "POST", "/api/v1/namespaces/default/secrets", body=body)
    assert answer.status == 422
    assert answer.body["message"].startswith(
        'Secret "regcred" is invalid: data[.dockerconfigjson]: Invalid value: "<secret contents redacted>": '
    )
    assert answer.body["details"]["causes"][0]["reason"] == "FieldValueInvalid"


def test_secret_data_that_is_not_base64_is_400(kube_client: ApiClient) -> None:
    answer = call(kube_client, "POST", "/api/v1/namespaces/default/secrets", body=secret("s", key="%%%"))
    assert (answer.status, answer.body["reason"]) == (400, "BadRequest")
    assert "illegal base64 data" in answer.body["message"]


def test_valid_dockerconfigjson_secret_from_string_data_is_stored_as_data(kube_client: ApiClient) -> None:
    config = json.dumps({"auths": {"registry.example": {"auth": b64("AWS:token")}}})
    body = {
        "metadata": {"name": "regcred"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config},
    }
    created = call(kube_client, "POST", "/api/v1/namespaces/default/secrets", body=body)
    assert created.status == 201
    read = call(kube_client, "GET", "/api/v1/namespaces/default/secrets/regcred").body
    assert "stringData" not in read
    assert base64.b64decode(read["data"][".dockerconfigjson"]).decode() == config


def test_deleting_a_node_answers_a_success_status(core_v1: CoreV1Api) -> None:
    uid = core_v1.create_node(node("n1")).metadata.uid
    answer = core_v1.delete_node("n1")
    assert answer == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "n1", "kind": "nodes", "uid": uid},
    }
    with pytest.raises(ApiException) as raised:
        core_v1.read_node("n1")
    assert raised.value.status == 404


def test_deleting_a_pod_or_service_account_answers_the_object(core_v1: CoreV1Api) -> None:
    core_v1.create_namespaced_pod("default", pod("web-1", "default"))
    deleted = core_v1.delete_namespaced_pod("web-1", "default")
    assert isinstance(deleted, V1Pod) and deleted.metadata.name == "web-1"
    core_v1.create_namespaced_service_account("default", {"metadata": {"name": "builder"}})
    assert core_v1.delete_namespaced_service_account("builder", "default").metadata.name == "builder"


def test_delete_with_a_stale_precondition_is_409(kube_client: ApiClient) -> None:
    call(kube_client, "POST", "/api/v1/nodes", body=node("n1"))
    answer = call(kube_client, "DELETE", "/api/v1/nodes/n1", body={"preconditions": {"resourceVersion": "1"}})
    assert (answer.status, answer.body["reason"]) == (409, "Conflict")
    assert answer.body["message"].startswith('Operation cannot be fulfilled on nodes "n1": Precondition failed')


def test_finalizers_hold_a_deleted_object_until_removed(core_v1: CoreV1Api) -> None:
    # Given a node with a finalizer
    body = node("n1")
    body["metadata"]["finalizers"] = ["example.com/drain"]
    core_v1.create_node(body)
    # When it is deleted, Then it stays, marked for deletion
    core_v1.delete_node("n1")
    assert core_v1.read_node("n1").metadata.deletion_timestamp is not None
    # And when the finalizer goes, so does the node
    core_v1.patch_node("n1", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as raised:
        core_v1.read_node("n1")
    assert raised.value.status == 404


def test_deleting_a_namespace_deletes_its_content(core_v1: CoreV1Api) -> None:
    core_v1.create_namespace({"metadata": {"name": "team"}})
    core_v1.create_namespaced_secret("team", secret("s"))
    answer = core_v1.delete_namespace("team")
    assert answer["status"]["phase"] == "Terminating"
    assert [n.metadata.name for n in core_v1.list_namespace().items if n.metadata.name == "team"] == []
    assert core_v1.list_secret_for_all_namespaces(field_selector="metadata.namespace=team").items == []


def test_delete_collection_deletes_the_selected_objects(core_v1: CoreV1Api) -> None:
    for name, tier in (("n1", "web"), ("n2", "web"), ("n3", "db")):
        core_v1.create_node(node(name, {"tier": tier}))
    core_v1.delete_collection_node(label_selector="tier=web")
    assert [n.metadata.name for n in core_v1.list_node().items] == ["n3"]


def test_dry_run_create_stores_nothing(kube_client: ApiClient, kube_api: KubeApiServer) -> None:
    answer = call(kube_client, "POST", "/api/v1/nodes", [("dryRun", "All")], body=node("n1"))
    assert answer.status == 201 and answer.body["metadata"]["name"] == "n1"
    assert kube_api.get_object("nodes", "n1") is None


def test_a_no_op_patch_writes_nothing(core_v1: CoreV1Api) -> None:
    created = core_v1.create_node(node("n1", {"a": "b"}))
    same = core_v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    assert same.metadata.resource_version == created.metadata.resource_version


def test_concurrent_read_modify_write_loses_no_update(kube_api: KubeApiServer) -> None:
    # Given one node and eight writers, each incrementing its counter 25 times with optimistic concurrency
    kube_api.seed_objects([{**node("n1"), "metadata": {"name": "n1", "annotations": {"count": "0"}}}])
    conflicts = []

    def writer() -> None:
        with kube_api.api_client() as client:
            v1 = CoreV1Api(client)
            for _ in range(25):
                while True:
                    current = v1.read_node("n1")
                    count = int(current.metadata.annotations["count"])
                    current.metadata.annotations["count"] = str(count + 1)
                    try:
                        v1.replace_node("n1", current)
                        break
                    except ApiException as e:
                        assert e.status == 409
                        conflicts.append(e)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # Then every increment landed, the losers of each race having been told 409
    assert kube_api.get_object("nodes", "n1")["metadata"]["annotations"]["count"] == "200"
    assert conflicts, "eight writers on one object should have collided at least once"


def owned_by(*owners: Any) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "ConfigMap", "name": o.metadata.name, "uid": o.metadata.uid,
             "controller": i == 0, "blockOwnerDeletion": True} for i, o in enumerate(owners)]


def test_deleting_an_owner_deletes_its_dependents_as_the_garbage_collector_does(core_v1: CoreV1Api) -> None:
    # Given an owner, a dependent, the dependent's own dependent, one with a second owner, and another's
    owner = core_v1.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    other = core_v1.create_namespaced_config_map("default", {"metadata": {"name": "other"}})
    child = core_v1.create_namespaced_config_map("default", {"metadata": {"name": "child",
                                                                          "ownerReferences": owned_by(owner)}})
    core_v1.create_namespaced_secret("default", {"metadata": {"name": "grandchild",
                                                               "ownerReferences": owned_by(child)}})
    core_v1.create_namespaced_config_map("default", {"metadata": {"name": "shared",
                                                                   "ownerReferences": owned_by(owner, other)}})
    core_v1.create_namespaced_config_map("default", {"metadata": {"name": "others",
                                                                   "ownerReferences": owned_by(other)}})

    # When the owner is deleted
    core_v1.delete_namespaced_config_map("owner", "default")

    # Then its dependents go, theirs too; one with a second owner loses the reference only
    names = {c.metadata.name for c in core_v1.list_namespaced_config_map("default").items}
    assert {"owner", "child"}.isdisjoint(names) and {"other", "shared", "others"} <= names
    assert "grandchild" not in {s.metadata.name for s in core_v1.list_namespaced_secret("default").items}
    shared = core_v1.read_namespaced_config_map("shared", "default")
    assert [ref.name for ref in shared.metadata.owner_references] == ["other"]

    # And with propagationPolicy Orphan the dependents stay, without the reference
    core_v1.delete_namespaced_config_map("other", "default", propagation_policy="Orphan")
    assert core_v1.read_namespaced_config_map("others", "default").metadata.owner_references is None
    assert core_v1.read_namespaced_config_map("shared", "default").metadata.owner_references is None

"""What `prewarm install` and the node agent write besides RBAC: ConfigMaps and Events (core/v1),
DaemonSets (apps/v1) and PriorityClasses (scheduling.k8s.io/v1), with the real registry's
defaulting, generation, status subresource, validation and RBAC, and kubectl applying the manifests."""

# The typed client declares every field optional and takes models, not dicts: these tests pass
# the API's JSON and read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch
from kubernetes.client import ApiClient, ApiException, AppsV1Api, CoreV1Api, SchedulingV1Api

from prewarm_devtools.kubeapi import Identity, KubeApiServer
from tests.support.kube import binding, call, role, rule, status_of, subject
from tests.support.kubectl import kubectl_binary

pytestmark = pytest.mark.integration

KUBECTL = kubectl_binary()


def daemon_set(
    name: str = "agent", labels: dict[str, str] | None = None, image: str = "registry.example/agent:1.0"
) -> dict[str, Any]:
    """A DaemonSet with only what the API server requires: a selector matching the template's labels."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels if labels is not None else {"app": name}},
                "spec": {"containers": [{"name": "agent", "image": image}]},
            },
        },
    }


def priority_class(name: str, value: int, **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        **fields,
    }


def node_event(name: str, node_name: str, reason: str = "ImagePulled", **fields: Any) -> dict[str, Any]:
    """An event about a node, as a node agent posts it (in `default`: nodes have no namespace)."""
    return {
        "metadata": {"name": name},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name},
        "reason": reason,
        "message": f"{reason} on {node_name}",
        "type": "Normal",
        "source": {"component": "prewarm-agent", "host": node_name},
        **fields,
    }


def invalid(error: ApiException) -> tuple[int, str, list[str]]:
    status = status_of(error)
    return error.status, status["message"], [c["field"] for c in status["details"]["causes"]]


@pytest.fixture
def apps_v1(kube_client: ApiClient) -> AppsV1Api:
    return AppsV1Api(kube_client)


@pytest.fixture
def scheduling_v1(kube_client: ApiClient) -> SchedulingV1Api:
    return SchedulingV1Api(kube_client)


# -- ConfigMaps ------------------------------------------------------------------------------------


def test_config_maps_are_created_read_listed_replaced_and_deleted(core_v1: CoreV1Api) -> None:
    created = core_v1.create_namespaced_config_map(
        "default", {"metadata": {"name": "settings"}, "data": {"LOG_LEVEL": "INFO"}}
    )
    assert created.data == {"LOG_LEVEL": "INFO"} and created.metadata.uid
    core_v1.create_namespaced_config_map("default", {"metadata": {"name": "other"}})
    selected = core_v1.list_namespaced_config_map("default", field_selector="metadata.name=settings")
    assert [c.metadata.name for c in selected.items] == ["settings"]
    created.data["LOG_LEVEL"] = "DEBUG"
    assert core_v1.replace_namespaced_config_map("settings", "default", created).data == {"LOG_LEVEL": "DEBUG"}
    assert core_v1.read_namespaced_config_map("settings", "default").data == {"LOG_LEVEL": "DEBUG"}
    assert core_v1.delete_namespaced_config_map("settings", "default")["status"] == "Success"
    with pytest.raises(ApiException) as raised:
        core_v1.read_namespaced_config_map("settings", "default")
    assert status_of(raised.value)["message"] == 'configmaps "settings" not found'


@pytest.mark.parametrize(
    ("body", "message", "field"),
    [
        (
            {"metadata": {"name": "c"}, "data": {"k": "v"}, "binaryData": {"k": base64.b64encode(b"v").decode()}},
            'ConfigMap "c" is invalid: data[k]: Invalid value: "k": duplicate of key present in binaryData',
            "data[k]",
        ),
        (
            {"metadata": {"name": "big"}, "data": {"a": "x" * (1024 * 1024), "b": "y"}},
            'ConfigMap "big" is invalid: []: Too long: must have at most 1048576 bytes',
            "[]",
        ),
    ],
    ids=["key-in-both", "over-one-mebibyte"],
)
def test_an_invalid_config_map_is_422(core_v1: CoreV1Api, body: dict[str, Any], message: str, field: str) -> None:
    with pytest.raises(ApiException) as raised:
        core_v1.create_namespaced_config_map("default", body)
    assert invalid(raised.value) == (422, message, [field])


def test_an_immutable_config_map_keeps_its_data(core_v1: CoreV1Api) -> None:
    # Given an immutable ConfigMap
    core_v1.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"k": "1"}, "immutable": True})
    # When its data is changed, Then the API refuses
    with pytest.raises(ApiException) as raised:
        core_v1.patch_namespaced_config_map("c", "default", {"data": {"k": "2"}})
    assert invalid(raised.value) == (
        422,
        'ConfigMap "c" is invalid: data: Forbidden: field is immutable when `immutable` is set',
        ["data"],
    )
    # And its metadata may still change
    labelled = core_v1.patch_namespaced_config_map("c", "default", {"metadata": {"labels": {"a": "b"}}})
    assert (labelled.metadata.labels, labelled.data) == ({"a": "b"}, {"k": "1"})


# -- Events ----------------------------------------------------------------------------------------


def test_node_events_are_posted_selected_by_their_node_watched_and_deleted(core_v1: CoreV1Api) -> None:
    # Given a watch on the events about node n1, from now
    rv = core_v1.list_namespaced_event("default").metadata.resource_version
    # When an agent posts events about two nodes
    created = core_v1.create_namespaced_event("default", node_event("n1.1", "n1"))
    core_v1.create_namespaced_event("default", node_event("n2.1", "n2", reason="PullFailed", type="Warning"))
    # Then they are stored as sent, with the fields the API server always writes
    assert (created.involved_object.kind, created.involved_object.name, created.reason) == ("Node", "n1", "ImagePulled")
    raw = core_v1.api_client.sanitize_for_serialization(created)
    assert (created.reporting_component, created.first_timestamp, created.event_time) == ("", None, None)
    assert raw["source"] == {"component": "prewarm-agent", "host": "n1"}
    # And the real field selectors find them
    by_node = core_v1.list_namespaced_event("default", field_selector="involvedObject.kind=Node,involvedObject.name=n1")
    assert [e.metadata.name for e in by_node.items] == ["n1.1"]
    for selector, names in [
        ("reason=PullFailed", ["n2.1"]),
        ("type=Warning", ["n2.1"]),
        ("source=prewarm-agent", ["n1.1", "n2.1"]),
        ("involvedObject.uid=n2,involvedObject.apiVersion=v1", ["n2.1"]),
        ("reportingComponent=", ["n1.1", "n2.1"]),
    ]:
        assert [e.metadata.name for e in core_v1.list_event_for_all_namespaces(field_selector=selector).items] == names
    w = watch.Watch()
    seen = []
    for event in w.stream(
        core_v1.list_namespaced_event,
        "default",
        resource_version=rv,
        field_selector="involvedObject.name=n1",
        timeout_seconds=10,
    ):
        seen.append((event["type"], event["object"].metadata.name))
        w.stop()
    assert seen == [("ADDED", "n1.1")]
    assert core_v1.read_namespaced_event("n1.1", "default").message == "ImagePulled on n1"
    assert core_v1.delete_namespaced_event("n1.1", "default")["status"] == "Success"
    assert [e.metadata.name for e in core_v1.list_namespaced_event("default").items] == ["n2.1"]


def test_an_event_must_live_in_its_objects_namespace(core_v1: CoreV1Api) -> None:
    core_v1.create_namespace({"metadata": {"name": "team"}})
    # A pod's event in another namespace than the pod's
    about_pod = node_event("e1", "n1")
    about_pod["involvedObject"] = {"kind": "Pod", "name": "web-1", "namespace": "default"}
    with pytest.raises(ApiException) as raised:
        core_v1.create_namespaced_event("team", about_pod)
    assert invalid(raised.value) == (
        422,
        'Event "e1" is invalid: involvedObject.namespace: Invalid value: "default": does not match event.namespace',
        ["involvedObject.namespace"],
    )
    # A node's event outside `default`
    with pytest.raises(ApiException) as raised:
        core_v1.create_namespaced_event("team", node_event("e2", "n1"))
    assert invalid(raised.value)[1] == (
        'Event "e2" is invalid: involvedObject.namespace: Invalid value: "": does not match event.namespace'
    )
    # A reason-less event about its own namespace's pod is fine
    about_pod["involvedObject"]["namespace"] = "team"
    del about_pod["reason"]
    assert core_v1.create_namespaced_event("team", about_pod).reason is None


def test_events_have_the_real_field_labels_only(kube_client: ApiClient) -> None:
    answer = call(kube_client, "GET", "/api/v1/events", query=[("fieldSelector", "spec.nodeName=n1")])
    assert (answer.status, answer.body["message"]) == (400, "field label not supported: spec.nodeName")


# -- DaemonSets ------------------------------------------------------------------------------------


def test_a_daemon_set_is_defaulted_as_the_api_server_does(apps_v1: AppsV1Api) -> None:
    body = daemon_set(image="registry.example/agent")
    body["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "registry.example/side:2"})
    body["status"] = {
        "currentNumberScheduled": 5,
        "numberMisscheduled": 0,
        "desiredNumberScheduled": 5,
        "numberReady": 5,
    }
    created = apps_v1.create_namespaced_daemon_set("default", body)
    spec, template = created.spec, created.spec.template.spec
    assert (spec.update_strategy.type, spec.revision_history_limit) == ("RollingUpdate", 10)
    assert (spec.update_strategy.rolling_update.max_unavailable, spec.update_strategy.rolling_update.max_surge) == (
        1,
        0,
    )
    assert (template.restart_policy, template.dns_policy, template.scheduler_name) == (
        "Always",
        "ClusterFirst",
        "default-scheduler",
    )
    assert template.termination_grace_period_seconds == 30
    agent, sidecar = template.containers
    assert (agent.termination_message_path, agent.termination_message_policy) == ("/dev/termination-log", "File")
    assert (agent.image_pull_policy, sidecar.image_pull_policy) == ("Always", "IfNotPresent")
    # Pod defaults that are not PodSpec defaults stay off the template
    assert template.enable_service_links is None
    # And the server owns generation, template generation and status
    assert created.metadata.generation == 1
    assert created.metadata.annotations == {"deprecated.daemonset.template.generation": "1"}
    assert (created.status.number_ready, created.status.desired_number_scheduled) == (0, 0)
    # An OnDelete strategy gets no rollingUpdate
    on_delete = daemon_set("other")
    on_delete["spec"]["updateStrategy"] = {"type": "OnDelete"}
    assert apps_v1.create_namespaced_daemon_set("default", on_delete).spec.update_strategy.rolling_update is None


def test_daemon_sets_are_read_listed_replaced_and_deleted(apps_v1: AppsV1Api) -> None:
    apps_v1.create_namespaced_daemon_set("default", daemon_set("agent"))
    apps_v1.create_namespaced_daemon_set("default", daemon_set("other"))
    selected = apps_v1.list_namespaced_daemon_set("default", field_selector="metadata.name=agent")
    assert [d.metadata.name for d in selected.items] == ["agent"]
    assert len(apps_v1.list_daemon_set_for_all_namespaces().items) == 2
    current = apps_v1.read_namespaced_daemon_set("agent", "default")
    current.spec.template.spec.containers[0].image = "registry.example/agent:2.0"
    replaced = apps_v1.replace_namespaced_daemon_set("agent", "default", current)
    assert replaced.spec.template.spec.containers[0].image.endswith(":2.0")
    assert apps_v1.delete_namespaced_daemon_set("agent", "default")["status"] == "Success"
    with pytest.raises(ApiException) as raised:
        apps_v1.read_namespaced_daemon_set("agent", "default")
    assert status_of(raised.value)["message"] == 'daemonsets.apps "agent" not found'


def test_generation_counts_spec_changes_only(apps_v1: AppsV1Api) -> None:
    def generations() -> tuple[int, str]:
        ds = apps_v1.read_namespaced_daemon_set("agent", "default")
        return int(ds.metadata.generation), str(ds.metadata.annotations["deprecated.daemonset.template.generation"])

    apps_v1.create_namespaced_daemon_set("default", daemon_set())
    # Metadata and status changes leave it
    apps_v1.patch_namespaced_daemon_set("agent", "default", {"metadata": {"labels": {"team": "a"}, "generation": 9}})
    apps_v1.patch_namespaced_daemon_set_status("agent", "default", {"status": {"numberReady": 2}})
    assert generations() == (1, "1")
    # A spec change outside the template moves the generation only
    apps_v1.patch_namespaced_daemon_set("agent", "default", {"spec": {"revisionHistoryLimit": 3}})
    assert generations() == (2, "1")
    # A template change moves both; the template generation cannot be set by a client
    new_image = {
        "metadata": {"annotations": {"deprecated.daemonset.template.generation": "7"}},
        "spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "registry.example/agent:2.0"}]}}},
    }
    apps_v1.patch_namespaced_daemon_set("agent", "default", new_image)
    assert generations() == (3, "2")


def test_the_status_subresource_and_the_main_resource_change_only_their_part(apps_v1: AppsV1Api) -> None:
    apps_v1.create_namespaced_daemon_set("default", daemon_set())
    # When the status is written with a changed spec, Then only the status changes
    current = apps_v1.read_namespaced_daemon_set("agent", "default")
    current.status.number_ready = current.status.desired_number_scheduled = 3
    current.spec.revision_history_limit = 1
    updated = apps_v1.replace_namespaced_daemon_set_status("agent", "default", current)
    assert (updated.status.number_ready, updated.spec.revision_history_limit, updated.metadata.generation) == (3, 10, 1)
    # When the main resource is written with a changed status, Then only the spec changes
    updated.status.number_ready = 0
    updated.spec.revision_history_limit = 5
    replaced = apps_v1.replace_namespaced_daemon_set("agent", "default", updated)
    assert (replaced.status.number_ready, replaced.spec.revision_history_limit, replaced.metadata.generation) == (
        3,
        5,
        2,
    )


def test_a_selector_that_does_not_match_the_template_is_422(apps_v1: AppsV1Api) -> None:
    with pytest.raises(ApiException) as raised:
        apps_v1.create_namespaced_daemon_set("default", daemon_set(labels={"app": "other", "tier": "node"}))
    assert invalid(raised.value) == (
        422,
        'DaemonSet.apps "agent" is invalid: spec.template.metadata.labels: Invalid value: '
        'map[string]string{"app":"other", "tier":"node"}: `selector` does not match template `labels`',
        ["spec.template.metadata.labels"],
    )
    # A missing selector selects nothing, so it cannot match either
    no_selector = daemon_set()
    del no_selector["spec"]["selector"]
    answer = call(apps_v1.api_client, "POST", "/apis/apps/v1/namespaces/default/daemonsets", body=no_selector)
    assert (answer.status, [c["field"] for c in answer.body["details"]["causes"]]) == (
        422,
        ["spec.template.metadata.labels"],
    )


def test_daemon_set_spec_rules(apps_v1: AppsV1Api) -> None:
    body = daemon_set()
    template = body["spec"]["template"]["spec"]
    template["containers"] = [{"name": "Agent_1", "image": "x"}]
    template["restartPolicy"] = "OnFailure"
    body["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}}
    with pytest.raises(ApiException) as raised:
        apps_v1.create_namespaced_daemon_set("default", body)
    assert invalid(raised.value)[2] == [
        "spec.template.spec.containers[0].name",
        "spec.template.spec.restartPolicy",
        "spec.updateStrategy.rollingUpdate.maxUnavailable",
    ]
    assert (
        'spec.template.spec.restartPolicy: Unsupported value: "OnFailure": supported values: "Always"'
        in (invalid(raised.value)[1])
    )
    body = daemon_set()
    body["spec"]["template"]["spec"]["containers"] = []
    body["spec"]["updateStrategy"] = {"type": "Blue"}
    with pytest.raises(ApiException) as raised:
        apps_v1.create_namespaced_daemon_set("default", body)
    assert invalid(raised.value)[1] == (
        'DaemonSet.apps "agent" is invalid: [spec.template.spec.containers: Required value, spec.updateStrategy: '
        'Unsupported value: apps.DaemonSetUpdateStrategy{Type:"Blue", RollingUpdate:(*apps.RollingUpdateDaemonSet)'
        '(nil)}: supported values: "RollingUpdate", "OnDelete"]'
    )


def test_the_selector_of_a_daemon_set_cannot_change(apps_v1: AppsV1Api) -> None:
    apps_v1.create_namespaced_daemon_set("default", daemon_set())
    change = {
        "spec": {
            "selector": {"matchLabels": {"app": "agent", "v": "2"}},
            "template": {"metadata": {"labels": {"app": "agent", "v": "2"}}},
        }
    }
    with pytest.raises(ApiException) as raised:
        apps_v1.patch_namespaced_daemon_set("agent", "default", change)
    assert invalid(raised.value)[1] == (
        'DaemonSet.apps "agent" is invalid: spec.selector: Invalid value: v1.LabelSelector{MatchLabels:'
        'map[string]string{"app":"agent", "v":"2"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: '
        "field is immutable"
    )


def test_a_strategic_merge_patch_merges_containers_env_and_volume_mounts_by_key(apps_v1: AppsV1Api) -> None:
    body = daemon_set()
    body["spec"]["template"]["spec"]["containers"][0].update(
        env=[{"name": "A", "value": "1"}], volumeMounts=[{"name": "sock", "mountPath": "/run/sock"}]
    )
    body["spec"]["template"]["spec"]["tolerations"] = [{"key": "a", "operator": "Exists"}]
    apps_v1.create_namespaced_daemon_set("default", body)
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "agent",
                            "env": [{"name": "B", "value": "2"}],
                            "volumeMounts": [{"mountPath": "/run/sock", "readOnly": True}],
                        }
                    ],
                    "tolerations": [{"operator": "Exists"}],
                }
            }
        }
    }
    patched = apps_v1.patch_namespaced_daemon_set("agent", "default", patch).spec.template.spec
    container = patched.containers[0]
    assert [(e.name, e.value) for e in container.env] == [("A", "1"), ("B", "2")]
    assert [(m.name, m.mount_path, m.read_only) for m in container.volume_mounts] == [("sock", "/run/sock", True)]
    # Tolerations have no merge key: the patch replaces them
    assert [(t.key, t.operator) for t in patched.tolerations] == [(None, "Exists")]


# -- PriorityClasses -------------------------------------------------------------------------------


def test_priority_classes_are_created_defaulted_listed_replaced_and_deleted(scheduling_v1: SchedulingV1Api) -> None:
    created = scheduling_v1.create_priority_class(priority_class("agent", 100000, description="Node agent"))
    assert (created.value, created.preemption_policy, created.global_default) == (100000, "PreemptLowerPriority", None)
    # Every cluster has the two system classes
    assert [c.metadata.name for c in scheduling_v1.list_priority_class().items] == [
        "agent",
        "system-cluster-critical",
        "system-node-critical",
    ]
    created.description = "The prewarm node agent"
    assert scheduling_v1.replace_priority_class("agent", created).description == "The prewarm node agent"
    assert scheduling_v1.delete_priority_class("agent")["status"] == "Success"
    with pytest.raises(ApiException) as raised:
        scheduling_v1.delete_priority_class("system-node-critical")
    assert (raised.value.status, status_of(raised.value)["message"]) == (
        403,
        'priorityclasses.scheduling.k8s.io "system-node-critical" is forbidden: this is a system priority class and '
        "cannot be deleted",
    )


def test_a_user_priority_above_one_billion_is_422(scheduling_v1: SchedulingV1Api) -> None:
    with pytest.raises(ApiException) as raised:
        scheduling_v1.create_priority_class(priority_class("too-high", 1_000_000_001))
    assert invalid(raised.value) == (
        422,
        'PriorityClass.scheduling.k8s.io "too-high" is invalid: value: Forbidden: maximum allowed value of a user '
        "defined priority is 1000000000",
        ["value"],
    )
    with pytest.raises(ApiException) as raised:
        scheduling_v1.create_priority_class(priority_class("system-mine", 10))
    assert invalid(raised.value)[1] == (
        'PriorityClass.scheduling.k8s.io "system-mine" is invalid: metadata.name: Forbidden: priority class names '
        "with 'system-' prefix are reserved for system use only. error: system-mine is not a known system priority "
        "class"
    )


def test_value_and_preemption_policy_are_immutable(scheduling_v1: SchedulingV1Api) -> None:
    scheduling_v1.create_priority_class(priority_class("agent", 10, preemptionPolicy="Never"))
    with pytest.raises(ApiException) as raised:
        scheduling_v1.patch_priority_class("agent", {"value": 11, "preemptionPolicy": "PreemptLowerPriority"})
    assert invalid(raised.value) == (
        422,
        'PriorityClass.scheduling.k8s.io "agent" is invalid: [value: Forbidden: may not be changed in an update., '
        'preemptionPolicy: Invalid value: "PreemptLowerPriority": field is immutable]',
        ["value", "preemptionPolicy"],
    )


def test_a_priority_value_must_be_an_int32_and_one_class_at_most_is_the_default(kube_client: ApiClient) -> None:
    answer = call(kube_client, "POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=priority_class("p", 2**31))
    assert (answer.status, answer.body["message"]) == (
        400,
        'PriorityClass in version "v1" cannot be handled as a PriorityClass: json: cannot unmarshal number '
        "2147483648 into Go struct field PriorityClass.value of type int32",
    )
    first = call(
        kube_client,
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        body=priority_class("a", 1, globalDefault=True),
    )
    assert first.status == 201 and first.body["globalDefault"] is True
    second = call(
        kube_client,
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        body=priority_class("b", 2, globalDefault=True),
    )
    assert (second.status, second.body["message"]) == (
        403,
        'priorityclasses.scheduling.k8s.io "b" is forbidden: PriorityClass a is already marked as default. Only one '
        "default can exist",
    )


# -- Discovery and RBAC ----------------------------------------------------------------------------


def test_discovery_lists_the_new_groups_and_resources(kube_client: ApiClient) -> None:
    groups = {g["name"]: g for g in call(kube_client, "GET", "/apis").body["groups"]}
    assert {"apps", "scheduling.k8s.io"} <= set(groups)
    assert groups["apps"]["preferredVersion"] == {"groupVersion": "apps/v1", "version": "v1"}
    assert call(kube_client, "GET", "/apis/scheduling.k8s.io").body["name"] == "scheduling.k8s.io"
    apps = {r["name"]: r for r in call(kube_client, "GET", "/apis/apps/v1").body["resources"]}
    assert set(apps) == {"daemonsets", "daemonsets/status"}
    assert (apps["daemonsets"]["shortNames"], apps["daemonsets"]["categories"]) == (["ds"], ["all"])
    assert (apps["daemonsets"]["namespaced"], apps["daemonsets/status"]["verbs"]) == (True, ["get", "patch", "update"])
    scheduling = call(kube_client, "GET", "/apis/scheduling.k8s.io/v1").body["resources"]
    assert [(r["name"], r["namespaced"], r["shortNames"]) for r in scheduling] == [("priorityclasses", False, ["pc"])]
    core = {r["name"]: r for r in call(kube_client, "GET", "/api/v1").body["resources"]}
    assert (core["configmaps"]["shortNames"], core["events"]["shortNames"]) == (["cm"], ["ev"])
    assert "deletecollection" in core["events"]["verbs"]


def test_rbac_authorizes_daemon_sets_by_the_apps_group(
    core_v1: CoreV1Api, kube_client: ApiClient, kube_client_as: Callable[[Identity], ApiClient]
) -> None:
    # Given alice, who may get daemonsets in team, and a role naming the wrong group
    core_v1.create_namespace({"metadata": {"name": "team"}})
    AppsV1Api(kube_client).create_namespaced_daemon_set("team", daemon_set())
    for obj in (
        role("ds-reader", [rule(["daemonsets"], ["get"], groups=("apps",))], "team"),
        role("wrong-group", [rule(["daemonsets"], ["create"])], "team"),
        binding("alice-ds", "ds-reader", [subject("User", "alice")], "team"),
        binding("alice-wrong", "wrong-group", [subject("User", "alice")], "team"),
    ):
        kind = obj["kind"].lower() + "s"
        assert (
            call(kube_client, "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/team/{kind}", body=obj).status
            == 201
        )
    alice = AppsV1Api(kube_client_as(Identity("alice")))
    # When she reads it, Then RBAC allows; when she creates one, Then it is the API server's 403
    assert alice.read_namespaced_daemon_set("agent", "team").metadata.generation == 1
    with pytest.raises(ApiException) as raised:
        alice.create_namespaced_daemon_set("team", daemon_set("mine"))
    assert (raised.value.status, status_of(raised.value)["message"]) == (
        403,
        'daemonsets.apps is forbidden: User "alice" cannot create resource "daemonsets" in API group "apps" in the '
        'namespace "team"',
    )
    assert status_of(raised.value)["details"] == {"group": "apps", "kind": "daemonsets"}
    with pytest.raises(ApiException) as raised:
        alice.patch_namespaced_daemon_set_status("agent", "team", {"status": {"numberReady": 1}})
    assert 'cannot patch resource "daemonsets/status" in API group "apps"' in status_of(raised.value)["message"]
    scheduling = SchedulingV1Api(kube_client_as(Identity("alice")))
    with pytest.raises(ApiException) as raised:
        scheduling.list_priority_class()
    assert status_of(raised.value)["message"] == (
        'priorityclasses.scheduling.k8s.io is forbidden: User "alice" cannot list resource "priorityclasses" in API '
        'group "scheduling.k8s.io" at the cluster scope'
    )


# -- kubectl ---------------------------------------------------------------------------------------


def _manifests(directory: Path) -> list[Path]:
    """What `prewarm install --render` prints for a stack, one file per object, in apply order."""
    import yaml

    from prewarm_cli.install.render import render, values_from_stack

    stack = {"STATUS_QUEUE_URL": "https://sqs.us-west-2.amazonaws.com/123456789012/pw-Status",
             "NODE_QUEUE_PREFIX": "pw-node", "NODE_DLQ_ARN": "arn:aws:sqs:us-west-2:123456789012:pw-NodeDLQ",
             "SECRET_PREFIX": "prewarm/pw", "AGENT_ROLE_ARN": "arn:aws:iam::123456789012:role/agents"}
    paths = []
    for index, doc in enumerate(render(values_from_stack(stack, region="us-west-2", image="agent:1",
                                                         pull_secret_namespaces=["default"]))):
        paths.append(directory / f"{index:02d}-{doc['kind'].lower()}.yaml")
        paths[-1].write_text(yaml.safe_dump(doc))
    return paths


def test_kubectl_applies_what_install_renders(tmp_path: Path) -> None:
    # Given kubectl (which sends no token over plain HTTP: the server serves it as the admin)
    with KubeApiServer(anonymous="allowed") as api:
        kubeconfig = str(api.write_kubeconfig(tmp_path / "config"))

        def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [KUBECTL, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60, check=False
            )

        # When every manifest is applied, twice (create, then kubectl's three-way patch)
        for _ in range(2):
            for manifest in _manifests(tmp_path):
                applied = kubectl("apply", "-f", str(manifest))
                assert applied.returncode == 0, f"{manifest.name}: {applied.stderr}"
        # Then the DaemonSet is there, as kubectl and the API show it
        listed = kubectl("get", "ds", "-n", "prewarm-system")
        assert listed.returncode == 0 and "prewarm-agent" in listed.stdout, listed.stderr
        agent = api.get_object("daemonsets", "prewarm-agent", "prewarm-system")
        assert agent is not None and agent["metadata"]["generation"] == 1
        assert json.loads(agent["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
        assert api.get_object("priorityclasses", "prewarm-agent") is not None
        assert api.get_object("configmaps", "prewarm-agent", "prewarm-system") is not None

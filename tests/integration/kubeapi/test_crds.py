"""CustomResourceDefinitions (apiextensions.k8s.io/v1) and their resources: establishment, the CRD
validation, discovery, CRUD through `CustomObjectsApi`, the status subresource, generation, schema
validation with the real server's messages, pruning, selectors, paging, watches, printer columns
(Tables), OpenAPI v3, RBAC, cleanup when a CRD goes, and kubectl applying both."""

# The typed client declares every field optional and takes models, not dicts: these tests pass
# the API's JSON and read fields they just asserted exist.
# mypy: disable-error-code="union-attr, arg-type, misc, index, operator, attr-defined, no-untyped-call"

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import watch
from kubernetes.client import ApiClient, ApiException, ApiextensionsV1Api, CoreV1Api, CustomObjectsApi

from prewarm_devtools.kubeapi import Identity, KubeApiServer
from tests.support.kube import binding, call, role, rule, status_of, subject
from tests.support.kubectl import kubectl_binary

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "prewarm.dev", "v1alpha1", "imagepulljobs"
JOB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["image"],
            "properties": {
                "image": {"type": "string", "minLength": 1, "maxLength": 64},
                "parallelism": {"x-kubernetes-int-or-string": True},
                "backoffLimit": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 10},
                "policy": {"type": "string", "enum": ["Always", "Never"]},
                "nodes": {
                    "type": "array",
                    "items": {"type": "string", "pattern": "^ip-"},
                    "minItems": 1,
                    "maxItems": 2,
                },
                "selector": {"type": "object", "additionalProperties": {"type": "string"}},
                "deadline": {"type": "string", "format": "date-time", "nullable": True},
                "pullPolicy": {"type": "string", "default": "IfNotPresent"},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
        "status": {"type": "object", "properties": {"active": {"type": "integer"}, "message": {"type": "string"}}},
    },
}
COLUMNS = [
    {"name": "ACTIVE", "type": "integer", "jsonPath": ".status.active"},
    {"name": "IMAGE", "type": "string", "jsonPath": ".spec.image"},
    {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "MESSAGE", "type": "string", "jsonPath": ".status.message", "priority": 1},
]


def crd(names: dict[str, Any], scope: str, schema: dict[str, Any], **version: Any) -> dict[str, Any]:
    """A CRD of the prewarm.dev group with one served, stored version."""
    served = {"name": VERSION, "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}, **version}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{names['plural']}.{GROUP}"},
        "spec": {"group": GROUP, "scope": scope, "names": names, "versions": [served]},
    }


def job_crd(**spec: Any) -> dict[str, Any]:
    """An ImagePullJob CRD like prewarm's: namespaced, a schema, the status subresource and printer columns."""
    names = {"kind": "ImagePullJob", "plural": PLURAL, "shortNames": ["ipj"], "categories": ["prewarm"]}
    made = crd(
        names,
        "Namespaced",
        copy.deepcopy(JOB_SCHEMA),
        subresources={"status": {}},
        additionalPrinterColumns=copy.deepcopy(COLUMNS),
    )
    made["spec"].update(spec)
    return made


def rule_crd() -> dict[str, Any]:
    """A cluster-scoped PrewarmRule CRD with no status subresource and no printer columns."""
    repositories = {"type": "array", "items": {"type": "string"}}
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {"repositories": repositories}},
            "status": {"type": "object", "properties": {"message": {"type": "string"}}},
        },
    }
    return crd({"kind": "PrewarmRule", "plural": "prewarmrules"}, "Cluster", schema)


def job(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ImagePullJob",
        "metadata": {"name": name, **({"labels": labels} if labels else {})},
        "spec": {"image": "registry.example/app:1.0", **spec},
    }


@pytest.fixture
def extensions(kube_client: ApiClient) -> ApiextensionsV1Api:
    return ApiextensionsV1Api(kube_client)


@pytest.fixture
def objects(kube_client: ApiClient, extensions: ApiextensionsV1Api) -> CustomObjectsApi:
    """`CustomObjectsApi` on a server that has the ImagePullJob and PrewarmRule CRDs."""
    extensions.create_custom_resource_definition(job_crd())
    extensions.create_custom_resource_definition(rule_crd())
    return CustomObjectsApi(kube_client)


def create_job(objects: CustomObjectsApi, body: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return cast(dict[str, Any], objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body))


def refused(call_it: Any, *args: Any) -> tuple[int, str]:
    with pytest.raises(ApiException) as raised:
        call_it(*args)
    return raised.value.status, status_of(raised.value)["message"]


def request(
    client: ApiClient,
    method: str,
    path: str,
    body: Any = None,
    content_type: str | None = None,
    accept: str = "application/json",
) -> tuple[int, Any, Any]:
    """A raw request: status, parsed body and response headers."""
    headers = {"Accept": accept, **({"Content-Type": content_type} if content_type else {})}
    method, url, headers, body, post = client.param_serialize(
        method=method, resource_path=path, header_params=headers, body=body, auth_settings=["BearerToken"]
    )
    response = client.call_api(method, url, headers, body, post)
    data = response.read()
    return response.status, json.loads(data) if data else None, response.headers


JOBS = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"


# -- CustomResourceDefinitions ---------------------------------------------------------------------


def test_a_created_crd_is_established_with_its_names_accepted(extensions: ApiextensionsV1Api) -> None:
    created = extensions.create_custom_resource_definition(job_crd())
    conditions = {c.type: (c.status, c.reason, c.message) for c in created.status.conditions}
    assert conditions == {
        "NamesAccepted": ("True", "NoConflicts", "no conflicts found"),
        "Established": ("True", "InitialNamesAccepted", "the initial names have been accepted"),
    }
    accepted = created.status.accepted_names
    assert (accepted.plural, accepted.singular, accepted.kind, accepted.list_kind) == (
        PLURAL,
        "imagepulljob",
        "ImagePullJob",
        "ImagePullJobList",
    )
    assert (accepted.short_names, accepted.categories) == (["ipj"], ["prewarm"])
    assert created.status.stored_versions == [VERSION]
    assert created.metadata.generation == 1 and created.spec.conversion.strategy == "None"
    assert extensions.read_custom_resource_definition(f"{PLURAL}.{GROUP}").metadata.uid == created.metadata.uid


def test_crds_are_discovered_as_crd(kube_client: ApiClient) -> None:
    resources = call(kube_client, "GET", "/apis/apiextensions.k8s.io/v1").body["resources"]
    crds = next(r for r in resources if r["name"] == "customresourcedefinitions")
    assert crds["shortNames"] == ["crd", "crds"] and crds["namespaced"] is False
    assert "customresourcedefinitions/status" in [r["name"] for r in resources]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c["metadata"].update(name="jobs.prewarm.dev"),
            'metadata.name: Invalid value: "jobs.prewarm.dev": must be spec.names.plural+"."+spec.group',
        ),
        (
            lambda c: (c["spec"].update(group="prewarm"), c["metadata"].update(name="imagepulljobs.prewarm")),
            'spec.group: Invalid value: "prewarm": should be a domain with at least one dot',
        ),
        (
            lambda c: c["spec"].update(scope="Global"),
            'spec.scope: Unsupported value: "Global": supported values: "Cluster", "Namespaced"',
        ),
        (
            lambda c: c["spec"]["versions"].append({**c["spec"]["versions"][0], "name": "v1"}),
            "must have exactly one version marked as storage version",
        ),
        (lambda c: c["spec"]["versions"][0].pop("schema"), "spec.versions[0].schema.openAPIV3Schema: Required value"),
        (
            lambda c: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].update(
                image={"minLength": 1}
            ),
            "spec.validation.openAPIV3Schema.properties[spec].properties[image].type: Required value: must not be "
            "empty for specified object fields",
        ),
        (
            lambda c: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].update(
                additionalProperties={"type": "string"}
            ),
            "spec.validation.openAPIV3Schema.properties[spec].additionalProperties: Forbidden: additionalProperties "
            "and properties are mutual exclusive",
        ),
        (
            lambda c: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"].update(type="string"),
            'spec.validation.openAPIV3Schema.type: Invalid value: "string": only "object" is allowed as the type at '
            "the root of the schema if the status subresource is enabled",
        ),
        (
            lambda c: c["spec"]["versions"][0]["additionalPrinterColumns"][0].update(type="text"),
            'spec.additionalPrinterColumns[0].type: Invalid value: "text": must be one of '
            "boolean,date,integer,number,string",
        ),
        (
            lambda c: c["spec"]["names"].update(listKind="ImagePullJob"),
            'spec.names.listKind: Invalid value: "ImagePullJob": kind and listKind may not be the same',
        ),
    ],
)
def test_invalid_crds_are_refused_as_the_real_server_words_it(
    extensions: ApiextensionsV1Api, change: Any, message: str
) -> None:
    crd = job_crd()
    change(crd)
    code, said = refused(extensions.create_custom_resource_definition, crd)
    assert code == 422
    assert said.startswith(f'CustomResourceDefinition.apiextensions.k8s.io "{crd["metadata"]["name"]}" is invalid: ')
    assert message in said


def test_a_crd_whose_kind_is_taken_in_its_group_is_not_established(
    kube_client: ApiClient, extensions: ApiextensionsV1Api
) -> None:
    extensions.create_custom_resource_definition(job_crd())
    other = job_crd()
    other["metadata"]["name"] = f"otherjobs.{GROUP}"
    other["spec"]["names"] = {"kind": "ImagePullJob", "plural": "otherjobs", "listKind": "OtherJobList"}
    created = extensions.create_custom_resource_definition(other)
    conditions = {c.type: (c.status, c.reason, c.message) for c in created.status.conditions}
    assert conditions["NamesAccepted"] == ("False", "KindConflict", '"ImagePullJob" is already in use')
    assert conditions["Established"] == ("False", "NotAccepted", "not all names are accepted")
    assert call(kube_client, "GET", f"/apis/{GROUP}/{VERSION}/otherjobs").status == 404


def test_the_names_and_group_of_an_established_crd_do_not_change(extensions: ApiextensionsV1Api) -> None:
    crd = extensions.create_custom_resource_definition(job_crd()).to_dict()
    changed = job_crd(scope="Cluster")
    changed["metadata"]["resourceVersion"] = crd["metadata"]["resource_version"]
    code, message = refused(extensions.replace_custom_resource_definition, f"{PLURAL}.{GROUP}", changed)
    assert (code, message) == (
        422,
        'CustomResourceDefinition.apiextensions.k8s.io "imagepulljobs.prewarm.dev" is '
        'invalid: spec.scope: Invalid value: "Cluster": field is immutable',
    )


def test_discovery_follows_crds_as_they_come_and_go(kube_client: ApiClient, extensions: ApiextensionsV1Api) -> None:
    assert GROUP not in [g["name"] for g in call(kube_client, "GET", "/apis").body["groups"]]
    extensions.create_custom_resource_definition(job_crd())
    group = next(g for g in call(kube_client, "GET", "/apis").body["groups"] if g["name"] == GROUP)
    assert group["preferredVersion"] == {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}
    assert call(kube_client, "GET", f"/apis/{GROUP}").body["versions"] == [group["preferredVersion"]]
    resources = call(kube_client, "GET", f"/apis/{GROUP}/{VERSION}").body["resources"]
    assert resources == [
        {
            "name": PLURAL,
            "singularName": "imagepulljob",
            "namespaced": True,
            "kind": "ImagePullJob",
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": ["ipj"],
            "categories": ["prewarm"],
        },
        {
            "name": f"{PLURAL}/status",
            "singularName": "",
            "namespaced": True,
            "kind": "ImagePullJob",
            "verbs": ["get", "patch", "update"],
        },
    ]
    extensions.delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
    assert GROUP not in [g["name"] for g in call(kube_client, "GET", "/apis").body["groups"]]
    assert call(kube_client, "GET", f"/apis/{GROUP}/{VERSION}").status == 404


def test_every_served_version_serves_the_same_objects(kube_client: ApiClient, extensions: ApiextensionsV1Api) -> None:
    crd = job_crd()
    crd["spec"]["versions"].insert(
        0, {**copy.deepcopy(crd["spec"]["versions"][0]), "name": "v1beta1", "storage": False}
    )
    extensions.create_custom_resource_definition(crd)
    objects = CustomObjectsApi(kube_client)
    made = objects.create_namespaced_custom_object(
        GROUP, "v1beta1", "default", PLURAL, {**job("j"), "apiVersion": f"{GROUP}/v1beta1"}
    )
    assert made["apiVersion"] == f"{GROUP}/v1beta1"
    read = objects.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "j")
    assert read["apiVersion"] == f"{GROUP}/{VERSION}" and read["metadata"]["uid"] == made["metadata"]["uid"]
    listed = objects.list_namespaced_custom_object(GROUP, "v1beta1", "default", PLURAL)
    assert [i["apiVersion"] for i in listed["items"]] == [f"{GROUP}/v1beta1"]
    group = call(kube_client, "GET", f"/apis/{GROUP}").body
    assert [v["version"] for v in group["versions"]] == ["v1beta1", VERSION]


# -- Custom resources ------------------------------------------------------------------------------


def test_custom_resources_are_created_read_listed_replaced_patched_and_deleted(objects: CustomObjectsApi) -> None:
    created = create_job(objects, job("j1", {"team": "a"}))
    assert created["metadata"]["generation"] == 1 and created["metadata"]["uid"]
    assert created["spec"]["pullPolicy"] == "IfNotPresent"  # the schema's default
    got = objects.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "j1")
    assert got == created
    created["spec"]["image"] = "registry.example/app:2.0"
    replaced = objects.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "j1", created)
    assert (replaced["spec"]["image"], replaced["metadata"]["generation"]) == ("registry.example/app:2.0", 2)
    patched = objects.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "j1", {"metadata": {"labels": {"team": "b"}}}
    )
    assert patched["metadata"]["labels"] == {"team": "b"} and patched["metadata"]["generation"] == 2
    everywhere = objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert (everywhere["kind"], [i["metadata"]["name"] for i in everywhere["items"]]) == ("ImagePullJobList", ["j1"])
    deleted = objects.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "j1")
    assert deleted["status"] == "Success" and deleted["details"] == {
        "name": "j1",
        "group": GROUP,
        "kind": PLURAL,
        "uid": created["metadata"]["uid"],
    }
    assert refused(objects.get_namespaced_custom_object, GROUP, VERSION, "default", PLURAL, "j1") == (
        404,
        f'{PLURAL}.{GROUP} "j1" not found',
    )


def test_cluster_scoped_custom_resources_have_no_namespace(objects: CustomObjectsApi) -> None:
    rule = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PrewarmRule",
        "metadata": {"name": "r1"},
        "spec": {"repositories": ["app"]},
        "status": {"message": "kept"},
    }
    created = objects.create_cluster_custom_object(GROUP, VERSION, "prewarmrules", rule)
    assert "namespace" not in created["metadata"] and created["status"] == {"message": "kept"}
    code, message = refused(
        objects.list_cluster_custom_object,
        GROUP,
        VERSION,
        "prewarmrules",
        None,
        None,
        None,
        "metadata.namespace=default",
    )
    assert (code, message) == (400, "field label not supported: metadata.namespace")
    # Without a status subresource, status is part of the object: changing it is a new generation.
    patched = objects.patch_cluster_custom_object(GROUP, VERSION, "prewarmrules", "r1", {"status": {"message": "new"}})
    assert (patched["status"], patched["metadata"]["generation"]) == ({"message": "new"}, 2)


def test_json_patch_applies_and_strategic_merge_patch_is_refused(
    kube_client: ApiClient, objects: CustomObjectsApi
) -> None:
    create_job(objects, job("j1", nodes=["ip-1"]))
    status, body, _ = request(
        kube_client,
        "PATCH",
        f"{JOBS}/j1",
        [{"op": "add", "path": "/spec/nodes/-", "value": "ip-2"}],
        "application/json-patch+json",
    )
    assert (status, body["spec"]["nodes"]) == (200, ["ip-1", "ip-2"])
    answer = call(
        kube_client,
        "PATCH",
        f"{JOBS}/j1",
        body={"spec": {"image": "x"}},
        content_type="application/strategic-merge-patch+json",
    )
    assert (answer.status, answer.body["reason"], answer.body["message"]) == (
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types "
        "include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
    )


def test_the_status_subresource_alone_writes_status(objects: CustomObjectsApi) -> None:
    created = create_job(objects, {**job("j1"), "status": {"active": 9}})
    assert "status" not in created  # status on create is dropped
    with_status = objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "j1", {"status": {"active": 2}, "spec": {"image": "ignored"}}
    )
    assert with_status["status"] == {"active": 2} and with_status["spec"]["image"] == "registry.example/app:1.0"
    assert with_status["metadata"]["generation"] == 1
    main = objects.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "j1", {"status": {"active": 7}, "spec": {"backoffLimit": 3}}
    )
    assert main["status"] == {"active": 2} and main["metadata"]["generation"] == 2
    with_status["status"] = {"active": "many"}
    with_status["metadata"]["resourceVersion"] = main["metadata"]["resourceVersion"]
    code, message = refused(
        objects.replace_namespaced_custom_object_status, GROUP, VERSION, "default", PLURAL, "j1", with_status
    )
    # The status validator's paths start at status, its messages do not.
    assert (code, message) == (
        422,
        'ImagePullJob.prewarm.dev "j1" is invalid: status.active: Invalid value: '
        '"string": active in body must be of type integer: "string"',
    )


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"image": ""}, 'spec.image: Invalid value: "": spec.image in body should be at least 1 chars long'),
        ({"image": "x" * 65}, "spec.image: Too long: may not be more than 64 bytes"),
        (
            {"backoffLimit": "3"},
            'spec.backoffLimit: Invalid value: "string": spec.backoffLimit in body must be of type integer: "string"',
        ),
        (
            {"parallelism": True},
            'spec.parallelism: Invalid value: "boolean": spec.parallelism in body must be of '
            'type integer,string: "boolean"',
        ),
        (
            {"backoffLimit": -1},
            "spec.backoffLimit: Invalid value: -1: spec.backoffLimit in body should be greater than or equal to 0",
        ),
        (
            {"backoffLimit": 11},
            "spec.backoffLimit: Invalid value: 11: spec.backoffLimit in body should be less than or equal to 10",
        ),
        ({"policy": "Sometimes"}, 'spec.policy: Unsupported value: "Sometimes": supported values: "Always", "Never"'),
        ({"nodes": ["node-1"]}, "spec.nodes[0]: Invalid value: \"node-1\": spec.nodes[0] in body should match '^ip-'"),
        ({"nodes": []}, "spec.nodes: Invalid value: 0: spec.nodes in body should have at least 1 items"),
        ({"nodes": ["ip-1", "ip-2", "ip-3"]}, "spec.nodes: Too many: 3: must have at most 2 items"),
        (
            {"selector": {"app": 1}},
            'spec.selector.app: Invalid value: "integer": spec.selector.app in body must be of type string: "integer"',
        ),
        (
            {"deadline": "tomorrow"},
            'spec.deadline: Invalid value: "tomorrow": spec.deadline in body must be of type date-time: "tomorrow"',
        ),
        ({"image": None}, "spec.image: Required value"),
    ],
)
def test_custom_resources_are_validated_against_the_schema_with_the_real_messages(
    objects: CustomObjectsApi, spec: dict[str, Any], error: str
) -> None:
    code, message = refused(create_job, objects, job("bad", **spec))
    assert (code, message) == (422, f'ImagePullJob.prewarm.dev "bad" is invalid: {error}')


def test_several_schema_errors_are_listed_together(objects: CustomObjectsApi) -> None:
    body = job("bad", backoffLimit=-1, policy="Sometimes")
    del body["spec"]["image"]
    code, message = refused(create_job, objects, body)
    assert (code, message) == (
        422,
        (
            'ImagePullJob.prewarm.dev "bad" is invalid: [spec.backoffLimit: Invalid value: -1: spec.backoffLimit in '
            'body should be greater than or equal to 0, spec.policy: Unsupported value: "Sometimes": supported values: '
            '"Always", "Never", spec.image: Required value]'
        ),
    )


def test_nulls_the_schema_allows_stay_and_others_go(objects: CustomObjectsApi) -> None:
    created = create_job(objects, job("j", deadline=None, backoffLimit=None))
    assert created["spec"]["deadline"] is None and "backoffLimit" not in created["spec"]


def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(
    kube_client: ApiClient, objects: CustomObjectsApi
) -> None:
    body = job("j1", colour="red", extra={"anything": {"goes": 1}})
    body["metadata"]["owner"] = "me"
    status, created, headers = request(kube_client, "POST", JOBS, body)
    assert status == 201 and "colour" not in created["spec"] and "owner" not in created["metadata"]
    assert created["spec"]["extra"] == {"anything": {"goes": 1}}  # x-kubernetes-preserve-unknown-fields
    assert headers.getlist("Warning") == [
        '299 - "unknown field \\"metadata.owner\\""',
        '299 - "unknown field \\"spec.colour\\""',
    ]
    strict = call(kube_client, "POST", JOBS, [("fieldValidation", "Strict")], job("j2", colour="red"))
    assert (strict.status, strict.body["message"]) == (
        400,
        'ImagePullJob in version "v1alpha1" cannot be handled as '
        "a ImagePullJob: strict decoding error: unknown field "
        '"spec.colour"',
    )
    patched = call(
        kube_client,
        "PATCH",
        f"{JOBS}/j1",
        [("fieldValidation", "Strict")],
        {"spec": {"colour": "red"}},
        "application/merge-patch+json",
    )
    assert (patched.status, patched.body["message"]) == (400, 'strict decoding error: unknown field "spec.colour"')
    ignored = call(kube_client, "POST", JOBS, [("fieldValidation", "Ignore")], job("j3", colour="red"))
    assert ignored.status == 201 and "colour" not in ignored.body["spec"]


def test_updates_need_a_resource_version_and_a_current_one(objects: CustomObjectsApi) -> None:
    created = create_job(objects, job("j1"))
    stale = copy.deepcopy(created)
    del created["metadata"]["resourceVersion"]
    assert refused(objects.replace_namespaced_custom_object, GROUP, VERSION, "default", PLURAL, "j1", created) == (
        422,
        f'{PLURAL}.{GROUP} "j1" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for '
        "an update",
    )
    objects.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "j1", {"spec": {"backoffLimit": 1}})
    code, message = refused(objects.replace_namespaced_custom_object, GROUP, VERSION, "default", PLURAL, "j1", stale)
    assert code == 409 and message.startswith(f'Operation cannot be fulfilled on {PLURAL}.{GROUP} "j1"')


def test_selectors_and_pages_work_as_for_built_in_types(objects: CustomObjectsApi, core_v1: CoreV1Api) -> None:
    core_v1.create_namespace({"metadata": {"name": "team"}})
    for name, team in (("a", "x"), ("b", "y"), ("c", "x")):
        create_job(objects, job(name, {"team": team}))
    create_job(objects, job("d", {"team": "x"}), namespace="team")
    selected = objects.list_cluster_custom_object(
        GROUP, VERSION, PLURAL, label_selector="team=x", field_selector="metadata.namespace=default"
    )
    assert [i["metadata"]["name"] for i in selected["items"]] == ["a", "c"]
    code, message = refused(
        objects.list_cluster_custom_object, GROUP, VERSION, PLURAL, None, None, None, "spec.image=x"
    )
    assert (code, message) == (400, "field label not supported: spec.image")
    first = objects.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, limit=2)
    assert [i["metadata"]["name"] for i in first["items"]] == ["a", "b"] and first["metadata"][
        "remainingItemCount"
    ] == 1
    rest = objects.list_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, limit=2, _continue=first["metadata"]["continue"]
    )
    assert [i["metadata"]["name"] for i in rest["items"]] == ["c"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_watches_see_custom_resources_come_change_and_go(objects: CustomObjectsApi) -> None:
    rv = objects.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["metadata"]["resourceVersion"]
    create_job(objects, job("j1"))
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "j1", {"status": {"active": 1}})
    objects.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "j1")
    w = watch.Watch()
    seen = []
    for event in w.stream(
        objects.list_namespaced_custom_object,
        GROUP,
        VERSION,
        "default",
        PLURAL,
        resource_version=rv,
        timeout_seconds=10,
    ):
        seen.append((event["type"], event["object"]["metadata"]["name"], event["object"].get("status")))
        if len(seen) == 3:
            w.stop()
    assert seen == [("ADDED", "j1", None), ("MODIFIED", "j1", {"active": 1}), ("DELETED", "j1", {"active": 1})]


def test_deleting_a_crd_deletes_its_objects(
    kube_client: ApiClient, objects: CustomObjectsApi, extensions: ApiextensionsV1Api, kube_api: KubeApiServer
) -> None:
    create_job(objects, job("plain"))
    held = job("held")
    held["metadata"]["finalizers"] = ["prewarm.dev/cleanup"]
    create_job(objects, held)
    answer = call(kube_client, "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{GROUP}")
    # Held by an object's finalizer: the CRD is Terminating, its other objects are gone, new ones refused.
    assert answer.status == 200 and answer.body["metadata"]["deletionTimestamp"]
    assert answer.body["metadata"]["finalizers"] == ["customresourcecleanup.apiextensions.k8s.io"]
    terminating = extensions.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
    assert {c.type: c.status for c in terminating.status.conditions}["Terminating"] == "True"
    assert [o["metadata"]["name"] for o in kube_api.list_objects(f"{PLURAL}.{GROUP}")] == ["held"]
    assert refused(create_job, objects, job("new")) == (
        403,
        f'{PLURAL}.{GROUP} "new" is forbidden: create not allowed while custom resource definition is terminating',
    )
    # When the last finalizer goes, the object goes, and the CRD with it.
    objects.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "held", {"metadata": {"finalizers": None}}
    )
    assert refused(extensions.read_custom_resource_definition, f"{PLURAL}.{GROUP}")[0] == 404
    assert call(kube_client, "GET", JOBS).status == 404


def test_deleting_a_namespace_deletes_its_custom_resources(
    objects: CustomObjectsApi, core_v1: CoreV1Api, kube_api: KubeApiServer
) -> None:
    core_v1.create_namespace({"metadata": {"name": "team"}})
    create_job(objects, job("j1"), namespace="team")
    create_job(objects, job("j2"))
    core_v1.delete_namespace("team")
    assert [o["metadata"]["name"] for o in kube_api.list_objects(f"{PLURAL}.{GROUP}")] == ["j2"]


def test_rbac_applies_to_custom_resources_by_group_and_plural(
    kube_api: KubeApiServer, kube_client_as: Any, objects: CustomObjectsApi
) -> None:
    create_job(objects, job("j1"))
    kube_api.seed_objects(
        [
            role("job-reader", [rule([PLURAL], ["get", "list"], groups=(GROUP,))], "default"),
            binding("alice-reads-jobs", "job-reader", [subject("User", "alice")], "default"),
        ]
    )
    alice = CustomObjectsApi(kube_client_as(Identity("alice")))
    assert [
        i["metadata"]["name"] for i in alice.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
    ] == ["j1"]
    code, message = refused(alice.create_namespaced_custom_object, GROUP, VERSION, "default", PLURAL, job("j2"))
    assert (code, message) == (
        403,
        f'{PLURAL}.{GROUP} is forbidden: User "alice" cannot create resource "{PLURAL}" '
        f'in API group "{GROUP}" in the namespace "default"',
    )
    assert (
        refused(
            alice.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            "default",
            PLURAL,
            "j1",
            {"status": {"active": 1}},
        )[0]
        == 403
    )


def test_seeded_crds_are_established_and_their_objects_seeded(kube_api: KubeApiServer, kube_client: ApiClient) -> None:
    kube_api.seed_objects([job("seeded"), job_crd()])
    listed = CustomObjectsApi(kube_client).list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["seeded"]


# -- Printer columns and OpenAPI -------------------------------------------------------------------

TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


def test_tables_show_the_printer_columns(kube_client: ApiClient, objects: CustomObjectsApi) -> None:
    create_job(objects, job("j1"))
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "j1", {"status": {"active": 3, "message": "pulling"}}
    )
    status, table, _ = request(kube_client, "GET", JOBS, accept=TABLE)
    assert (status, table["kind"], table["apiVersion"]) == (200, "Table", "meta.k8s.io/v1")
    assert [(c["name"], c["type"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Name", "string", 0),
        ("ACTIVE", "integer", 0),
        ("IMAGE", "string", 0),
        ("AGE", "date", 0),
        ("MESSAGE", "string", 1),
    ]
    [row] = table["rows"]
    assert row["cells"][:3] == ["j1", 3, "registry.example/app:1.0"] and row["cells"][4] == "pulling"
    assert row["cells"][3].endswith("s")  # an age: "0s", "1s"
    assert row["object"]["kind"] == "PartialObjectMetadata" and row["object"]["metadata"]["name"] == "j1"
    assert table["metadata"]["resourceVersion"]
    _, single, _ = request(kube_client, "GET", f"{JOBS}/j1?includeObject=Object", accept=TABLE)
    assert [r["cells"][0] for r in single["rows"]] == ["j1"] and single["rows"][0]["object"]["spec"]["image"]


def test_a_crd_without_printer_columns_shows_the_age(kube_client: ApiClient, objects: CustomObjectsApi) -> None:
    objects.create_cluster_custom_object(
        GROUP,
        VERSION,
        "prewarmrules",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PrewarmRule", "metadata": {"name": "r1"}},
    )
    _, table, _ = request(kube_client, "GET", f"/apis/{GROUP}/{VERSION}/prewarmrules", accept=TABLE)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Age"]
    assert table["rows"][0]["cells"][0] == "r1"


def test_openapi_v3_describes_custom_resources(kube_client: ApiClient, objects: CustomObjectsApi) -> None:
    paths = call(kube_client, "GET", "/openapi/v3").body["paths"]
    assert {"api/v1", "apis/apps/v1", f"apis/{GROUP}/{VERSION}"} <= set(paths)
    url = paths[f"apis/{GROUP}/{VERSION}"]["serverRelativeURL"]
    assert url.startswith(f"/openapi/v3/apis/{GROUP}/{VERSION}?hash=")
    doc = call(kube_client, "GET", url.split("?")[0]).body
    schema = doc["components"]["schemas"]["dev.prewarm.v1alpha1.ImagePullJob"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": GROUP, "version": VERSION, "kind": "ImagePullJob"}]
    assert schema["properties"]["spec"] == JOB_SCHEMA["properties"]["spec"]
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in doc["components"]["schemas"]
    patch = doc["paths"][f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}"]["patch"]
    assert sorted(patch["requestBody"]["content"]) == [
        "application/apply-patch+yaml",
        "application/json-patch+json",
        "application/merge-patch+json",
    ]
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert patch["x-kubernetes-group-version-kind"] == {"group": GROUP, "version": VERSION, "kind": "ImagePullJob"}
    daemon_sets = call(kube_client, "GET", "/openapi/v3/apis/apps/v1").body["paths"]
    assert (
        "application/strategic-merge-patch+json"
        in daemon_sets["/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"]["patch"]["requestBody"]["content"]
    )


def test_the_openapi_hash_changes_with_the_crd(
    objects: CustomObjectsApi, kube_client: ApiClient, extensions: ApiextensionsV1Api
) -> None:
    before = call(kube_client, "GET", "/openapi/v3").body["paths"][f"apis/{GROUP}/{VERSION}"]["serverRelativeURL"]
    crd = rule_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["tags"] = {
        "type": "array",
        "items": {"type": "string"},
    }
    extensions.patch_custom_resource_definition(
        f"prewarmrules.{GROUP}", {"spec": {"versions": crd["spec"]["versions"]}}
    )
    after = call(kube_client, "GET", "/openapi/v3").body["paths"][f"apis/{GROUP}/{VERSION}"]["serverRelativeURL"]
    assert before != after


# -- kubectl ---------------------------------------------------------------------------------------


def _version(binary: str) -> tuple[int, int]:
    shown = subprocess.run(
        [binary, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30, check=False
    )
    version = json.loads(shown.stdout)["clientVersion"]
    return int(version["major"]), int(version["minor"].rstrip("+"))


# Where `make node-deps` unpacks Debian's kubernetes-client (kubectl 1.20) as root.
_UNPACKED_1_20 = Path(__file__).resolve().parents[3] / "build" / "kubectl-1.20" / "usr" / "bin" / "kubectl"


def _kubectls() -> list[str]:
    """/usr/bin/kubectl, and a kubectl 1.20 (Debian's kubernetes-client): named by PREWARM_KUBECTL_1_20, or as
    `make node-deps` unpacks it."""
    candidates = ("/usr/bin/kubectl", os.environ.get("PREWARM_KUBECTL_1_20", ""), str(_UNPACKED_1_20))
    found = [b for b in candidates if b and shutil.which(b)]
    return list(dict.fromkeys(found))


def _kubectl_1_20() -> str | None:
    return next((b for b in _kubectls() if _version(b) == (1, 20)), None)


@pytest.fixture
def kubectl_api() -> Iterator[KubeApiServer]:
    # kubectl sends the kubeconfig's token over TLS only.
    with KubeApiServer(tls=True) as api:
        yield api


def _apply_crd_and_objects(binary: str, api: KubeApiServer, tmp_path: Path) -> None:
    kubeconfig = str(api.write_kubeconfig(tmp_path / "config"))

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [binary, "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "cache"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    files = {
        "crd": job_crd(),
        "job": {**job("j1"), "metadata": {"name": "j1", "namespace": "default"}},
        "bad": job("bad", backoffLimit="three"),
        "unknown": job("unknown", colour="red"),
    }
    for name, body in files.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(body))
    # When the CRD and an object of it are applied (no --validate=false: the server validates)
    for name in ("crd", "job"):
        applied = kubectl("apply", "-f", str(tmp_path / f"{name}.yaml"))
        assert applied.returncode == 0, f"{name}: {applied.stderr}"
    # Then kubectl shows the printer columns
    listed = kubectl("get", PLURAL)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split("\n")[0].split() == ["NAME", "ACTIVE", "IMAGE", "AGE"]
    assert listed.stdout.split("\n")[1].split()[:2] == ["j1", "registry.example/app:1.0"]
    assert kubectl("get", "ipj", "-o", "name").stdout.strip() == f"imagepulljob.{GROUP}/j1"
    # And applying again patches (a merge patch: custom resources take no strategic merge patch)
    files["job"]["spec"]["backoffLimit"] = 2
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(files["job"]))
    again = kubectl("apply", "-f", str(tmp_path / "job.yaml"))
    assert again.returncode == 0 and "configured" in again.stdout, again.stderr
    assert api.get_object(f"{PLURAL}.{GROUP}", "j1", "default")["spec"]["backoffLimit"] == 2
    # And an invalid object is refused with the server's message
    bad = kubectl("apply", "-f", str(tmp_path / "bad.yaml"))
    assert bad.returncode != 0
    assert (
        'spec.backoffLimit: Invalid value: "string": spec.backoffLimit in body must be of type integer: "string"'
        in bad.stderr
    )
    # And an unknown field is refused where kubectl asks for strict validation (1.27 and later), else warned of
    unknown = kubectl("apply", "-f", str(tmp_path / "unknown.yaml"))
    if _version(binary) >= (1, 27):
        assert unknown.returncode != 0 and 'strict decoding error: unknown field "spec.colour"' in unknown.stderr
    else:
        assert unknown.returncode == 0 and 'unknown field "spec.colour"' in unknown.stderr


def test_kubectl_applies_a_crd_and_its_objects_and_shows_their_columns(
    kubectl_api: KubeApiServer, tmp_path: Path
) -> None:
    _apply_crd_and_objects(kubectl_binary(), kubectl_api, tmp_path)


def test_debian_kubectl_1_20_applies_a_crd_and_its_objects(kubectl_api: KubeApiServer, tmp_path: Path) -> None:
    binary = _kubectl_1_20()
    if binary is None:
        pytest.skip("no kubectl 1.20 (Debian's kubernetes-client: `make node-deps` as root unpacks it, or name it "
                    "with PREWARM_KUBECTL_1_20)")
    _apply_crd_and_objects(binary, kubectl_api, tmp_path)


def test_kubectl_get_watch_keeps_the_printer_columns_for_every_event(kubectl_api: KubeApiServer,
                                                                     tmp_path: Path) -> None:
    # Given the CRD and one object
    kubeconfig = str(kubectl_api.write_kubeconfig(tmp_path / "config"))
    kubectl_api.seed_objects([job_crd(), {**job("first"), "metadata": {"name": "first", "namespace": "default"}}])
    watching = subprocess.Popen(
        [kubectl_binary(), "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "cache"), "get", PLURAL, "-w",
         "--request-timeout=4s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # When another is created while kubectl watches
        assert watching.stdout is not None
        header = watching.stdout.readline()
        assert header.split() == ["NAME", "ACTIVE", "IMAGE", "AGE"]
        assert watching.stdout.readline().split()[:2] == ["first", "registry.example/app:1.0"]
        with ApiClient(kubectl_api.client_configuration()) as client:
            CustomObjectsApi(client).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("second"))
        # Then its row has the same columns, not NAME and AGE alone
        assert watching.stdout.readline().split()[:2] == ["second", "registry.example/app:1.0"]
    finally:
        watching.kill()
        watching.communicate()

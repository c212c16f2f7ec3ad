"""One table of job manifests, run through the model (`prewarm apply`, the resource sync) and through the
CRDs `prewarm install` ships (schema, list types and CEL rules, as the embedded API evaluates them, as
`kubectl apply` meets them): the two must agree, so that a rule said twice cannot drift.

The cases are those OpenKruise's validating webhook refuses (pkg/webhook/imagepulljob/validating and
imagelistpulljob/validating, their handlers and tests), for both kinds, plus Prewarm's own rules. At least
90% of Kruise's are refused at apply; the rest are refused by the model only, each for a reason given here
and in docs/job-spec.md ("Refused at apply, or later").
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from prewarm.domain.jobs import ImageListPullJob, ImagePullJob
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.rules import PrewarmRule
from prewarm_cli.install.crds import custom_resource_definitions
from prewarm_devtools.kubeapi.customresources import custom_resource_types, definition_status
from prewarm_devtools.kubeapi.errors import FieldError
from prewarm_devtools.kubeapi.resources.types import ResourceType

Obj = dict[str, Any]
DIGEST = "sha256:" + "a" * 64
#: Refused by the model only, and why the CRD cannot say it.
MODEL_ONLY = {
    "label key in matchLabels": "a map's keys have no schema; CEL over them exceeds the API server's cost budget",
    "repository path over 255": "a pattern cannot count one part of the reference",
    "same image twice, written differently": "normalising references (docker.io/library/) is beyond CEL",
}


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # ImagePullJob, ImageListPullJob, PrewarmRule
    spec: Obj
    kruise_refuses: bool = True
    model_only: str = ""  # a MODEL_ONLY key: the CRD accepts it, the model refuses it
    valid: bool = False
    fields: tuple[str, ...] = field(default=())  # the field paths the CRD names


def job(name: str, *, kruise: bool = True, model_only: str = "", **spec: Any) -> list[Case]:
    """The case for both job kinds: Kruise's two webhooks apply the same template rules."""
    return [Case(f"{name} (ImagePullJob)", "ImagePullJob", {"image": "nginx:1.27", **spec}, kruise, model_only),
            Case(f"{name} (ImageListPullJob)", "ImageListPullJob", {"images": ["nginx:1.27", "redis:7"], **spec},
                 kruise, model_only)]


def valid(name: str, kind: str = "ImagePullJob", **spec: Any) -> Case:
    base = {"ImagePullJob": {"image": "nginx"}, "ImageListPullJob": {"images": ["nginx"]},
            "PrewarmRule": {"repositories": ["team/*"]}}[kind]
    return Case(name, kind, {**base, **spec}, kruise_refuses=False, valid=True)


def single(name: str, kind: str, spec: Obj, *, kruise: bool = True, model_only: str = "") -> Case:
    return Case(name, kind, spec, kruise, model_only)


def labels(**selector: Any) -> Obj:
    return selector


CASES: list[Case] = [
    # --- selector and podSelector (metav1.LabelSelectorAsSelector, names rules)
    *job("names with matchLabels", selector={"names": ["n1"], "matchLabels": {"a": "b"}}),
    *job("names with matchExpressions",
         selector={"names": ["n1"], "matchExpressions": [{"key": "a", "operator": "Exists"}]}),
    *job("duplicate node names", selector={"names": ["n1", "n2", "n1"]}),
    *job("In without values", selector={"matchExpressions": [{"key": "a", "operator": "In"}]}),
    *job("NotIn with empty values", selector={"matchExpressions": [{"key": "a", "operator": "NotIn", "values": []}]}),
    *job("Exists with values", selector={"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
    *job("unknown operator", selector={"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
    *job("bad matchExpressions key", selector={"matchExpressions": [{"key": "a b", "operator": "Exists"}]}),
    *job("bad matchExpressions value",
         selector={"matchExpressions": [{"key": "a", "operator": "In", "values": ["-x"]}]}),
    *job("bad matchLabels value", selector={"matchLabels": {"tier": "a b"}}),
    *job("label key in matchLabels", selector={"matchLabels": {"bad key": "x"}}, model_only="label key in matchLabels"),
    *job("podSelector with selector", selector={"matchLabels": {"a": "b"}}, podSelector={"matchLabels": {"c": "d"}}),
    *job("bad podSelector", podSelector={"matchExpressions": [{"key": "app", "operator": "In"}]}),
    *job("label key in podSelector's matchLabels", podSelector={"matchLabels": {"a/b/c": "x"}},
         model_only="label key in matchLabels"),
    *job("label key name part over 63", podSelector={"matchExpressions": [{"key": "k" * 64, "operator": "Exists"}]}),
    # --- parallelism (Kruise's TestValidateParallelism tables)
    *job("negative parallelism", parallelism=-1),
    *job("percentage parallelism", parallelism="50%"),
    *job("negative string parallelism", parallelism="-1"),
    *job("non-numeric parallelism", parallelism="abc"),
    *job("parallelism over int32", parallelism=2**31),
    *job("string parallelism over int32", parallelism="2147483648"),
    # --- completionPolicy (ImagePullJob only: Kruise's list webhook skips the deadline check; Prewarm's model does not)
    single("deadline below timeout", "ImagePullJob", {"image": "nginx", "pullPolicy": {"timeoutSeconds": 900},
                                                      "completionPolicy": {"activeDeadlineSeconds": 600}}),
    single("deadline below the default timeout", "ImagePullJob",
           {"image": "nginx", "completionPolicy": {"activeDeadlineSeconds": 599}}),
    single("list job deadline below timeout", "ImageListPullJob",
           {"images": ["nginx"], "completionPolicy": {"activeDeadlineSeconds": 60}}, kruise=False),
    *job("Never with a deadline", completionPolicy={"type": "Never", "activeDeadlineSeconds": 900}),
    *job("Never with a ttl", completionPolicy={"type": "Never", "ttlSecondsAfterFinished": 60}),
    *job("unknown completion type", completionPolicy={"type": "Sometimes"}),
    # --- images (daemonutil.NormalizeImageRef)
    single("empty image", "ImagePullJob", {"image": ""}),
    single("uppercase repository", "ImagePullJob", {"image": "Nginx:1.27"}),
    single("space in image", "ImagePullJob", {"image": "nginx 1.27"}),
    single("bad tag", "ImagePullJob", {"image": "nginx:-1"}),
    single("short digest", "ImagePullJob", {"image": "nginx@sha256:abc"}),
    single("unknown digest algorithm", "ImagePullJob", {"image": "nginx@md5:" + "a" * 32}),
    single("image ID", "ImagePullJob", {"image": "a" * 64}),
    single("repository path over 255", "ImagePullJob", {"image": "r.example/" + "a" * 256},
           model_only="repository path over 255"),
    single("no images", "ImageListPullJob", {"images": []}),
    single("duplicate images", "ImageListPullJob", {"images": ["nginx:1", "redis", "nginx:1"]}),
    single("over 255 images", "ImageListPullJob", {"images": [f"app{i}:1" for i in range(256)]}),
    single("bad image in a list", "ImageListPullJob", {"images": ["nginx", "Redis"]}),
    single("same image twice, written differently", "ImageListPullJob",
           {"images": ["nginx", "docker.io/library/nginx:latest"]}, kruise=False,
           model_only="same image twice, written differently"),
    # --- Prewarm's own rules (Kruise accepts these)
    *job("pullSecretsOnly without pullSecrets", kruise=False, pullSecretsOnly=True),
    *job("bad pull secret name", kruise=False, pullSecrets=["Not_A_Name"]),
    *job("bad node name", kruise=False, selector={"names": ["Node_1"]}),
    *job("Never image pull policy", kruise=False, imagePullPolicy="Never"),
    single("rule template Never", "PrewarmRule",
           {"repositories": ["a"], "template": {"spec": {"completionPolicy": {"type": "Never"}}}}, kruise=False),
    single("rule template names with matchLabels", "PrewarmRule",
           {"repositories": ["a"], "template": {"spec": {"selector": {"names": ["n"], "matchLabels": {"a": "b"}}}}},
           kruise=False),
    single("rule glob with a space", "PrewarmRule", {"repositories": ["team a/*"]}, kruise=False),
    single("rule account id unquoted-like", "PrewarmRule", {"repositories": ["a"], "accountIds": ["12345"]},
           kruise=False),
    single("rule region", "PrewarmRule", {"repositories": ["a"], "regions": ["Europe"]}, kruise=False),
    single("rule namespace", "PrewarmRule", {"repositories": ["a"], "template": {"metadata": {"namespace": "Shop"}}},
           kruise=False),
    # --- accepted by both
    valid("numeric string parallelism", parallelism="50"),
    valid("zero string parallelism", parallelism="0"),
    valid("signed string parallelism", "ImageListPullJob", parallelism="+3"),
    valid("zero parallelism", parallelism=0),
    valid("deadline equal to timeout", completionPolicy={"activeDeadlineSeconds": 600}),
    valid("Never", "ImageListPullJob", completionPolicy={"type": "Never"}),
    valid("digest-pinned", image=f"registry.example:5000/team/app:1.0@{DIGEST}"),
    valid("node names", selector={"names": ["ip-10-0-0-1.ec2.internal", "n2"]}),
    valid("label selector", podSelector={"matchLabels": {"app.kubernetes.io/name": "shop"},
                                         "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]},
                                                              {"key": "gpu", "operator": "DoesNotExist"}]}),
    valid("own pull secrets", pullSecrets=["regcred"], pullSecretsOnly=True),
    valid("rule with a template", "PrewarmRule", accountIds=["123456789012"], regions=["eu-west-1"],
          template={"metadata": {"namespace": "shop"}, "spec": {"parallelism": "5"}}),
]
API_VERSION = "prewarm.dev/v1alpha1"


def manifest(case: Case) -> Obj:
    metadata: Obj = {"name": "case"} if case.kind == "PrewarmRule" else {"name": "case", "namespace": "shop"}
    return {"apiVersion": API_VERSION, "kind": case.kind, "metadata": metadata, "spec": copy.deepcopy(case.spec)}


def resource_type(kind: str) -> ResourceType:
    (crd,) = [c for c in custom_resource_definitions() if c["spec"]["names"]["kind"] == kind]
    crd = copy.deepcopy(crd)
    definition_status(crd, [], "2026-11-27T00:00:00Z")
    (served,) = custom_resource_types(crd)
    return served


TYPES = {kind: resource_type(kind) for kind in ("ImagePullJob", "ImageListPullJob", "PrewarmRule", "WarmSnapshot")}


def crd_errors(doc: Obj, old: Obj | None = None) -> list[FieldError]:
    """What the API server says of `doc`: decoding (pruning, defaults), then the version's validation."""
    rtype = TYPES[doc["kind"]]
    assert rtype.decode(doc) == [], "the table's manifests hold no unknown fields"
    return rtype.validate(doc, old)


def model_errors(doc: Obj) -> list[tuple[str, str]]:
    try:
        parse_manifest(copy.deepcopy(doc))
    except JobValidationError as e:
        return [(error.path, error.message) for error in e.errors]
    return []


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_model_and_the_crd_agree(case: Case) -> None:
    doc = manifest(case)
    model = model_errors(doc)
    crd = crd_errors(doc)
    assert bool(model) is not case.valid, f"model: {model}"
    if case.model_only:
        assert case.model_only in MODEL_ONLY
        assert crd == [], f"the CRD refuses {case.name}: move it out of MODEL_ONLY"
        return
    assert bool(crd) is not case.valid, f"CRD: {[str(e) for e in crd]}; model: {model}"
    # Each field the API server names is one the model names, or holds one (map keys: `.key`, not `[key]`).
    model_paths = [re.sub(r"\[([^\]0-9][^\]]*)\]", r".\1", path) for path, _ in model]
    for error in crd:
        if error.field == "<nil>":
            continue
        assert any(p == error.field or p.startswith((f"{error.field}.", f"{error.field}[")) for p in model_paths), (
            f"{error} names a field the model does not: {model}"
        )


# Refused by Kruise, accepted by Prewarm on purpose (docs/job-spec.md, "Differences from Kruise").
ACCEPTED_BY_DESIGN = ["changing spec.pullSecrets of an ImagePullJob"]


def test_nine_in_ten_of_kruises_refusals_are_refused_at_apply() -> None:
    kruise = [case for case in CASES if case.kruise_refuses]
    at_apply = [case for case in kruise if not case.model_only]
    assert len(kruise) >= 60
    share = len(at_apply) / (len(kruise) + len(ACCEPTED_BY_DESIGN))
    assert share >= 0.9, [case.name for case in kruise if case.model_only]


def test_every_error_names_its_field_as_kubectl_prints_it() -> None:
    by_name = {case.name: case for case in CASES}
    shown = {name: [str(e) for e in crd_errors(manifest(by_name[name]))] for name in (
        "names with matchLabels (ImagePullJob)", "percentage parallelism (ImagePullJob)",
        "duplicate node names (ImageListPullJob)", "Never with a deadline (ImagePullJob)",
        "deadline below the default timeout", "In without values (ImageListPullJob)", "duplicate images")}
    assert shown == {
        "names with matchLabels (ImagePullJob)": [
            'spec.selector: Invalid value: "object": names cannot be combined with matchLabels or matchExpressions; '
            "use one"],
        "percentage parallelism (ImagePullJob)": [
            'spec.parallelism: Invalid value: "": percentages such as "50%" are not supported: give a number of nodes '
            'such as 5 or "5"'],
        "duplicate node names (ImageListPullJob)": [
            'spec.selector.names: Invalid value: "array": must not name a node twice'],
        "Never with a deadline (ImagePullJob)": [
            'spec.completionPolicy.activeDeadlineSeconds: Invalid value: "object": may only be set when '
            "completionPolicy.type is Always"],
        "deadline below the default timeout": [
            'spec.completionPolicy.activeDeadlineSeconds: Invalid value: "object": must be >= '
            "pullPolicy.timeoutSeconds (600)"],
        "In without values (ImageListPullJob)": [
            'spec.selector.matchExpressions[0].values: Invalid value: "object": must be non-empty when operator is In'],
        "duplicate images": ['spec.images: Invalid value: "array": must not list an image twice'],
    }


# --- Defaults ---------------------------------------------------------------------------------------


def defaults_of(schema: Obj, path: str = "") -> dict[str, Any]:
    found = {path: schema["default"]} if "default" in schema else {}
    for key, prop in (schema.get("properties") or {}).items():
        found.update(defaults_of(prop, f"{path}.{key}" if path else key))
    return found


@pytest.mark.parametrize("kind", ["ImagePullJob", "ImageListPullJob"])
def test_the_crds_store_kruises_defaults_which_the_model_fills_in_too(kind: str) -> None:
    spec_schema = TYPES[kind].custom.schema["properties"]["spec"]  # type: ignore[union-attr]
    leaves = {path: value for path, value in defaults_of(spec_schema).items() if value != {}}
    expected = {"completionPolicy.type": "Always", "pullPolicy.timeoutSeconds": 600, "pullPolicy.backoffLimit": 3}
    if kind == "ImagePullJob":
        expected["imagePullPolicy"] = "IfNotPresent"  # Kruise defaults it on ImagePullJob only
    assert leaves == expected
    model = (ImagePullJob if kind == "ImagePullJob" else ImageListPullJob).from_manifest(
        manifest(valid("defaults", kind))).to_manifest()["spec"]
    for path, value in leaves.items():
        holder = model
        *parents, leaf = path.split(".")
        for part in parents:
            holder = holder[part]
        assert holder[leaf] == value, path
    doc = manifest(valid("defaults", kind))
    assert crd_errors(doc) == []
    stored = doc["spec"]
    assert stored["completionPolicy"] == {"type": "Always"}
    assert stored["pullPolicy"] == {"timeoutSeconds": 600, "backoffLimit": 3}


def test_a_rules_template_takes_no_defaults_so_it_stores_what_was_written() -> None:
    doc = manifest(valid("rule", "PrewarmRule", template={"spec": {"parallelism": 2}}))
    assert crd_errors(doc) == []
    assert doc["spec"]["template"]["spec"] == {"parallelism": 2}
    assert PrewarmRule.from_manifest(doc).spec.template.spec.pull_policy.timeout_seconds == 600


# --- Kruise's markers -------------------------------------------------------------------------------


def test_selectors_are_atomic_maps_with_atomic_lists_as_kruise_marks_them() -> None:
    spec = TYPES["ImagePullJob"].custom.schema["properties"]["spec"]["properties"]  # type: ignore[union-attr]
    for selector in ("selector", "podSelector"):
        schema = spec[selector]
        assert schema["x-kubernetes-map-type"] == "atomic"
        expressions = schema["properties"]["matchExpressions"]
        assert expressions["x-kubernetes-list-type"] == "atomic"
        assert expressions["items"]["properties"]["values"]["x-kubernetes-list-type"] == "atomic"
    # names is atomic too: server-side apply replaces an applier's names whole, as with Kruise's CRD.
    assert spec["selector"]["properties"]["names"]["x-kubernetes-list-type"] == "atomic"


# --- Transition: Kruise's pullSecrets immutability is not copied ------------------------------------


def test_changing_pull_secrets_is_accepted_where_kruise_refuses_it() -> None:
    old = manifest(valid("secrets", pullSecrets=["a"]))
    crd_errors(old)
    new = manifest(valid("secrets", pullSecrets=["b"]))
    assert crd_errors(new, old) == []
    assert model_errors(new) == []


# --- samplefiles ------------------------------------------------------------------------------------

SAMPLES = Path(__file__).resolve().parents[3] / "samplefiles"


def sample_documents() -> list[Obj]:
    found = []
    for path in sorted([*SAMPLES.glob("jobs/*.yaml"), *SAMPLES.glob("rules/*.yaml"),
                        *SAMPLES.glob("warmsnapshots/*.yaml")]):
        for doc in yaml.safe_load_all(path.read_text()):
            items = doc.get("items", []) if doc and doc.get("kind") == "List" else [doc]
            found += [{**item, "apiVersion": API_VERSION} for item in items if item and item.get("kind") in TYPES]
    return found


@pytest.mark.parametrize("doc", sample_documents(), ids=lambda d: f"{d['kind']} {d['metadata']['name']}")
def test_every_sample_is_accepted_at_apply_as_a_resource(doc: Obj) -> None:
    assert [str(e) for e in crd_errors(copy.deepcopy(doc))] == []
    assert model_errors(doc) == []


@pytest.mark.parametrize(("spec", "field"), [
    ({"amiFamily": "Bottlerocket", "dataVolume": {"deviceName": "/dev/xvdc"}}, "spec.dataVolume.deviceName"),
    ({"amiFamily": "AL2023", "dataVolume": {"deviceName": "/dev/xvdb"}}, "spec.dataVolume.mountPath"),
    ({"nodeClass": {}}, "spec.nodeClass"),
    ({"amiFamily": "Ubuntu"}, "spec.amiFamily"),
])
def test_a_warm_snapshot_the_model_refuses_the_crd_refuses_naming_the_same_field(spec: Obj, field: str) -> None:
    doc = {"apiVersion": API_VERSION, "kind": "WarmSnapshot", "metadata": {"name": "gpu"},
           "spec": {"nodeClass": {"ec2NodeClass": "gpu"}, "amiFamily": "Bottlerocket", "rules": ["ml"],
                    "builder": {"subnetIds": ["subnet-0123456789abcdef0"]}, **spec}}
    assert [path for path, _ in model_errors(doc)] == [field]
    # The API server adds that the CEL rules were not run on an object its schema refused ("<nil>").
    assert [e.field for e in crd_errors(copy.deepcopy(doc)) if e.field != "<nil>"] == [field]

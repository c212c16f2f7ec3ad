"""Inputs for the fuzz tests: near-valid documents (right field names, plausible or garbage values,
fields missing or extra) and plain garbage, plus the checks every error answer must pass."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import strategies as st

# What a raw pydantic error looks like; the project's errors translate it into the input's words.
PYDANTIC_WORDING = re.compile(
    r"validation errors? for |input_value=|input_type=|errors\.pydantic\.dev|For further information|\[type=")

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def maybe(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly plausible values, sometimes anything at all."""
    return st.one_of(plausible, plausible, plausible, json_values)


def document(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping with any subset of `fields`, sometimes an unknown one too."""
    known = st.fixed_dictionaries({}, optional=fields)
    return st.one_of(known, known, st.builds(lambda d, k, v: {**d, k: v}, known, st.text(max_size=10), json_values))


names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True) | st.text(max_size=30)
label_maps = st.dictionaries(names | st.sampled_from(["app", "kubernetes.io/arch", "a/b/c", ""]),
                             names | st.integers(), max_size=3)
hexes = st.text("0123456789abcdefABCDEF", min_size=0, max_size=70)
digests = st.one_of(st.builds(lambda h: f"sha256:{h}", hexes), st.just("sha256:" + "a" * 64), st.text(max_size=20))
image_refs = st.one_of(
    st.sampled_from(["nginx", "nginx:1.27", "registry.k8s.io/pause:3.9", "localhost:5000/a/b",
                     "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/llm@sha256:" + "a" * 64]),
    st.builds(lambda host, repo, tag, digest: f"{host}{repo}{tag}{digest}",
              st.sampled_from(["", "docker.io/", "Host:99/", "[::1]:5000/", "a.b/", "-x/"]),
              st.from_regex(r"[a-z0-9._/-]{0,30}", fullmatch=True),
              st.sampled_from(["", ":v1", ":", ":-bad", ":" + "t" * 130]),
              st.sampled_from(["", "@sha256:" + "a" * 64, "@sha256:abc", "@SHA256:" + "a" * 64, "@md5:" + "a" * 32])),
    st.text(max_size=60),
)
selectors = document({
    "names": maybe(st.lists(names, max_size=3)),
    "matchLabels": maybe(label_maps),
    "matchExpressions": maybe(st.lists(document({
        "key": maybe(names), "operator": maybe(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "in"])),
        "values": maybe(st.lists(names, max_size=3))}), max_size=2)),
})
template_specs = document({
    "parallelism": maybe(st.integers(-2, 2**32) | st.sampled_from(["50%", None])),
    "selector": maybe(selectors),
    "podSelector": maybe(selectors),
    "pullSecrets": maybe(st.lists(names, max_size=2)),
    "pullPolicy": maybe(document({"timeoutSeconds": maybe(st.integers(-1, 2**32)),
                                  "backoffLimit": maybe(st.integers(-1, 2**32))})),
    "completionPolicy": maybe(document({
        "type": maybe(st.sampled_from(["Always", "Never", "Sometimes"])),
        "activeDeadlineSeconds": maybe(st.integers(-1, 2**32)),
        "ttlSecondsAfterFinished": maybe(st.integers(-1, 2**32))})),
    "sandboxConfig": maybe(document({"labels": maybe(label_maps), "annotations": maybe(label_maps)})),
    "imagePullPolicy": maybe(st.sampled_from(["Always", "IfNotPresent", "Never"])),
})
metadata = document({"name": maybe(names), "namespace": maybe(names), "labels": maybe(label_maps),
                     "annotations": maybe(label_maps), "uid": json_values, "resourceVersion": json_values})
api_versions = st.sampled_from(["apps.kruise.io/v1alpha1", "apps.kruise.io/v1beta1", "prewarm.dev/v1alpha1", "v1"])


def _with(base: st.SearchStrategy[dict[str, Any]], **extra: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(lambda spec, more: {**spec, **more}, base, st.fixed_dictionaries({}, optional=extra))


job_manifests = document({
    "apiVersion": maybe(api_versions),
    "kind": maybe(st.sampled_from(["ImagePullJob", "ImageListPullJob", "Pod"])),
    "metadata": maybe(metadata),
    "spec": maybe(_with(template_specs, image=maybe(image_refs), images=maybe(st.lists(image_refs, max_size=4)))),
    "status": json_values,
})
rule_manifests = document({
    "apiVersion": maybe(st.just("prewarm.dev/v1alpha1") | api_versions),
    "kind": maybe(st.just("PrewarmRule")),
    "metadata": maybe(metadata),
    "spec": maybe(document({
        "repositories": maybe(st.lists(st.text(max_size=12), max_size=3)),
        "tags": maybe(st.lists(st.text(max_size=12), max_size=3)),
        "includeUntagged": maybe(st.booleans()),
        "registries": maybe(st.lists(st.text(max_size=20), max_size=2)),
        "accountIds": maybe(st.lists(st.sampled_from(["123456789012", "1234"]) | st.integers(), max_size=2)),
        "regions": maybe(st.lists(st.sampled_from(["us-east-1", "mars-1"]), max_size=2)),
        "template": maybe(document({"metadata": maybe(document({"namespace": maybe(names),
                                                                "labels": maybe(label_maps)})),
                                    "spec": maybe(template_specs)})),
    })),
})
dns_names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,15}[a-z0-9])?", fullmatch=True)
good_labels = st.dictionaries(st.sampled_from(["app", "team", "kubernetes.io/arch", "example.com/tier"]),
                              st.from_regex(r"([a-z0-9]([-a-z0-9_.]{0,10}[a-z0-9])?)?", fullmatch=True), max_size=2)
good_images = st.sampled_from(["nginx", "nginx:1.27", "registry.k8s.io/pause:3.9", "localhost:5000/a/b:dev",
                               "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/llm@sha256:" + "a" * 64])
good_template = st.fixed_dictionaries({}, optional={
    "parallelism": st.integers(0, 50),
    "selector": st.one_of(st.fixed_dictionaries({"names": st.lists(dns_names, min_size=1, max_size=3, unique=True)}),
                          st.fixed_dictionaries({"matchLabels": good_labels})),
    "pullSecrets": st.lists(dns_names, max_size=2),
    "pullPolicy": st.fixed_dictionaries({}, optional={"timeoutSeconds": st.integers(1, 600),
                                                      "backoffLimit": st.integers(0, 5)}),
    "completionPolicy": st.fixed_dictionaries({"type": st.just("Always")}, optional={
        "activeDeadlineSeconds": st.integers(600, 7200), "ttlSecondsAfterFinished": st.integers(0, 3600)}),
    "sandboxConfig": st.fixed_dictionaries({}, optional={"labels": good_labels, "annotations": good_labels}),
    "imagePullPolicy": st.sampled_from(["Always", "IfNotPresent"]),
})
good_jobs = st.one_of(
    st.builds(lambda api, name, ns, spec, image: {"apiVersion": api, "kind": "ImagePullJob",
                                                  "metadata": {"name": name, "namespace": ns},
                                                  "spec": {**spec, "image": image}},
              api_versions.filter(lambda v: v != "v1"), dns_names, dns_names, good_template, good_images),
    st.builds(lambda name, spec, images: {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImageListPullJob",
                                          "metadata": {"name": name}, "spec": {**spec, "images": images}},
              dns_names, good_template, st.lists(good_images, min_size=1, max_size=3, unique=True)),
)
good_rules = st.builds(
    lambda name, repos, tags, spec, ns: {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule",
                                         "metadata": {"name": name},
                                         "spec": {"repositories": repos, "tags": tags,
                                                  "template": {"metadata": {"namespace": ns}, "spec": spec}}},
    dns_names, st.lists(st.sampled_from(["ml/*", "*", "web/app", "team-?/*"]), min_size=1, max_size=2),
    st.lists(st.sampled_from(["*", "v*", "1.*", "latest"]), min_size=1, max_size=2), good_template, dns_names,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: Any, path: tuple[Any, ...], how: str, garbage: Any) -> Any:
    if not path:
        return garbage if how == "replace" else doc
    head, rest = path[0], path[1:]
    copy: Any = dict(doc) if isinstance(doc, dict) else list(doc)
    if rest:
        copy[head] = _mutate(doc[head], rest, how, garbage)
    elif how == "delete":
        del copy[head]
    elif how == "replace":
        copy[head] = garbage
    elif isinstance(copy, dict):
        copy[f"{head}x"] = garbage  # an unknown sibling field
    return copy


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]]) -> Any:
    """A valid document with up to three mutations: a field deleted, replaced by garbage, or a sibling added."""
    doc: Any = draw(valid)
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        doc = _mutate(doc, path, draw(st.sampled_from(["delete", "replace", "add"])), draw(json_values))
    return doc


manifests = st.one_of(mutated(good_jobs), mutated(good_rules), job_manifests, rule_manifests, json_values)

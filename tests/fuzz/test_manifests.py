"""Job and rule manifests, as documents and as YAML text: valid, or a `JobValidationError` naming the field.

Whatever a user applies, the answer is a parsed manifest or one error type whose every problem has
the Kubernetes-style path of the field at fault and a message in the manifest's words.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from prewarm.domain.jobs import ImageListPullJob, ImagePullJob
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.manifests import parse_manifest, parse_manifests
from prewarm.domain.rules import PrewarmRule
from tests.fuzz.strategies import (
    PYDANTIC_WORDING,
    digests,
    good_jobs,
    good_rules,
    image_refs,
    job_manifests,
    manifests,
    mutated,
    rule_manifests,
)

EXAMPLES = settings(max_examples=300, deadline=None)


def assert_names_the_fields(error: JobValidationError, doc: Any) -> None:
    text = str(error)
    assert text and not PYDANTIC_WORDING.search(text), text
    assert error.errors, text
    for problem in error.errors:
        assert problem.message, text
        # Only a document that is no mapping, or no YAML, has a problem without a field path (or a
        # field whose name is empty, which the message names).
        unnamed = not problem.path and not problem.message.startswith('unknown field ""')
        assert not (unnamed and isinstance(doc, dict)), f"no field named in {text!r}"


def check(doc: Any) -> Any:
    try:
        parsed = parse_manifest(doc)
    except JobValidationError as e:
        assert_names_the_fields(e, doc)
        return None
    # A manifest that parses writes back one that parses to the same thing.
    assert parse_manifest(parsed.to_manifest()) == parsed
    return parsed


@EXAMPLES
@given(manifests)
def test_any_document_is_a_manifest_or_a_validation_error_naming_the_field(doc: Any) -> None:
    check(doc)


@EXAMPLES
@given(st.one_of(mutated(good_jobs), job_manifests))
def test_a_valid_job_has_a_stable_spec_hash_and_list_jobs_valid_children(doc: Any) -> None:
    parsed = check(doc)
    if isinstance(parsed, ImagePullJob | ImageListPullJob):
        assert parsed.spec_hash() == type(parsed).from_manifest(parsed.to_manifest()).spec_hash()
    if isinstance(parsed, ImageListPullJob):
        children = list(parsed.child_jobs())
        assert len({c.metadata.name for c in children}) == len(children) == len(parsed.spec.images)


@EXAMPLES
@given(st.one_of(mutated(good_rules), rule_manifests), st.text(max_size=30),
       st.one_of(st.none(), st.text(max_size=20)), st.text(max_size=40), digests)
def test_a_valid_rule_matches_any_push_without_error_and_builds_a_valid_job_or_names_the_field(
    doc: Any, repository: str, tag: str | None, registry: str, digest: str
) -> None:
    rule = check(doc)
    if not isinstance(rule, PrewarmRule):
        return
    if rule.matches(repository, tag, registry):
        try:
            job = rule.job_for_push(registry, repository, digest, tag)
        except JobValidationError as e:
            assert_names_the_fields(e, {})
        else:
            assert job.spec.image.endswith(f"@{digest}")


@settings(max_examples=200, deadline=None)
@given(st.one_of(
    st.lists(manifests, max_size=3).map(yaml.safe_dump_all),
    st.text(max_size=200),
    st.lists(st.sampled_from(["---\n", "kind: List\n", "items:\n", "- ", "  ", "apiVersion: v1\n", "&a [*a]\n",
                              "!!python/object:os.system {}\n", "{", "]", ": ", "2024-01-01\n", "? [a]\n",
                              "spec: {image: 'nginx'}\n", "\t", "\x00", "\ud800"]), max_size=12).map("".join),
))
def test_any_yaml_text_is_manifests_or_one_validation_error(text: str) -> None:
    try:
        parsed = parse_manifests(text)
    except JobValidationError as e:
        assert str(e) and not PYDANTIC_WORDING.search(str(e)), str(e)
        assert all(problem.message for problem in e.errors)
    else:
        assert all(isinstance(m, ImagePullJob | ImageListPullJob | PrewarmRule) for m in parsed)


@EXAMPLES
@given(image_refs)
def test_any_image_field_is_accepted_or_its_error_quotes_the_image(image: str) -> None:
    doc = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob", "metadata": {"name": "j"},
           "spec": {"image": image}}
    try:
        parse_manifest(doc)
    except JobValidationError as e:
        assert [p.path for p in e.errors] == ["spec.image"], str(e)
        assert_names_the_fields(e, doc)


def test_a_kind_that_is_no_string_is_named_not_a_type_error() -> None:
    # Given a manifest whose kind is a list (a YAML typo: `kind: [ImagePullJob]`)
    doc = {"apiVersion": "apps.kruise.io/v1alpha1", "kind": ["ImagePullJob"], "metadata": {"name": "j"}}
    # When it is parsed, then the error names the kind
    try:
        parse_manifest(doc)
    except JobValidationError as e:
        assert [p.path for p in e.errors] == ["kind"]
    else:
        raise AssertionError("a list kind was accepted")


# The shapes a file may have besides objects: a plain string, a top-level list, a List of anything.
_SHAPES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["kind", "items", "a"]), inner,
                                                                max_size=3),
    max_leaves=8,
)


@EXAMPLES
@given(st.lists(_SHAPES, min_size=1, max_size=3))
def test_the_cli_reads_any_document_shape_as_objects_or_problems_naming_the_document(shapes: list[Any]) -> None:
    from prewarm_cli.commands.apply import _documents

    text = yaml.safe_dump_all(shapes)
    documents, problems = _documents("f.yaml", text)
    # Every document handed on is an object; every other one is a problem that names its document
    assert all(isinstance(doc.body, dict) for doc in documents)
    assert all(problem.startswith("f.yaml") for problem in problems)
    assert all("must be a mapping" in p for p in problems if "duplicate key" not in p and "invalid YAML" not in p)

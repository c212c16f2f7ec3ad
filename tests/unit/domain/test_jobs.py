"""ImagePullJob, ImageListPullJob and PrewarmRule manifests: Kruise's schema, defaults and webhook rules."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from prewarm.domain.jobs import LIST_JOB_ANNOTATION, ImageListPullJob, ImagePullJob
from prewarm.domain.kubernetes import FieldError, JobValidationError
from prewarm.domain.manifests import parse_manifest, parse_manifests
from prewarm.domain.rules import PrewarmRule

# Kubernetes' naming rules, in the words users see them.
SUBDOMAIN_RULE = (
    "must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com')"
)
LABEL_RULE = (
    "must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name')"
)
NAME_PART_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyName' or 'my.name')"
)
ALWAYS_ONLY = "may only be set when spec.completionPolicy.type is Always"

SAMPLES = pathlib.Path(__file__).parents[3] / "samplefiles"
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
DIGEST = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def pull_job(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "ImagePullJob",
        "metadata": {"name": "web"},
        "spec": {"image": "nginx:1.25", **spec},
    }


def list_job(images: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "ImageListPullJob",
        "metadata": {"name": "base", "namespace": "platform"},
        "spec": {"images": images, **spec},
    }


def rule(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "prewarm.dev/v1alpha1",
        "kind": "PrewarmRule",
        "metadata": {"name": "shop"},
        "spec": {"repositories": ["shop/*"], **spec},
    }


def errors_of(doc: Any) -> list[str]:
    with pytest.raises(JobValidationError) as caught:
        parse_manifest(doc)
    return [str(error) for error in caught.value.errors]


# --- Samples --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_sample_file_is_valid_and_round_trips_through_to_manifest(path: pathlib.Path) -> None:
    # Given a realistic sample manifest file
    # When it is parsed and written back
    manifests = parse_manifests(path.read_text())
    # Then every document is valid and parses back to the same object with the same hash
    assert manifests
    for manifest in manifests:
        again = parse_manifest(manifest.to_manifest())
        assert again == manifest
        assert again.spec_hash() == manifest.spec_hash()


def test_kruise_sample_with_names_is_read_field_for_field() -> None:
    # Given the Kruise ImagePullJob sample selecting named nodes
    (job,) = parse_manifests((SAMPLES / "jobs" / "imagepulljob-nodes-always.yaml").read_text())
    # Then its fields land on snake_case attributes
    assert isinstance(job, ImagePullJob)
    assert job.key == "shop/checkout-api-2-14-0"
    assert job.spec.selector is not None
    assert job.spec.selector.names == ["ip-10-0-12-34.ec2.internal", "ip-10-0-45-67.ec2.internal"]
    assert job.spec.parallelism == 2
    assert (job.spec.pull_policy.backoff_limit, job.spec.pull_policy.timeout_seconds) == (2, 300)
    assert job.spec.completion_policy.type == "Always"
    assert job.spec.completion_policy.active_deadline_seconds == 1200
    assert job.spec.completion_policy.ttl_seconds_after_finished == 300
    assert job.spec.image_pull_policy == "IfNotPresent"


def test_kruise_sample_with_label_selector_and_sandbox_config_is_read() -> None:
    (job,) = parse_manifests((SAMPLES / "jobs" / "imagepulljob-labels-never.yaml").read_text())
    assert isinstance(job, ImagePullJob)
    assert job.api_version == "apps.kruise.io/v1beta1"
    assert job.spec.selector is not None
    assert job.spec.selector.match_labels == {"karpenter.sh/nodepool": "gpu"}
    assert [e.operator for e in job.spec.selector.match_expressions or []] == ["In", "NotIn", "DoesNotExist"]
    assert job.spec.sandbox_config is not None
    assert job.spec.sandbox_config.annotations == {"example.com/cost-center": "ml-platform"}
    assert job.spec.completion_policy.type == "Never"


def test_pod_selector_sample_keeps_pull_secrets_and_always_pull_policy() -> None:
    (job,) = parse_manifests((SAMPLES / "jobs" / "imagepulljob-podselector.yaml").read_text())
    assert isinstance(job, ImagePullJob)
    assert job.spec.pod_selector is not None and job.spec.selector is None
    assert job.spec.pull_secrets == ["ghcr-pull"]
    assert job.spec.image_pull_policy == "Always"


# --- Defaults and round trips ---------------------------------------------------------------------


def test_minimal_job_gets_kruise_defaults() -> None:
    # Given an ImagePullJob with only an image
    job = parse_manifest(pull_job())
    # Then the namespace and Kruise's webhook defaults are filled in
    assert isinstance(job, ImagePullJob)
    assert job.to_manifest() == {
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "ImagePullJob",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "image": "nginx:1.25",
            "parallelism": 1,
            "pullPolicy": {"timeoutSeconds": 600, "backoffLimit": 3},
            "completionPolicy": {"type": "Always"},
            "imagePullPolicy": "IfNotPresent",
        },
    }


@pytest.mark.parametrize("api_version", ["apps.kruise.io/v1alpha1", "apps.kruise.io/v1beta1", "prewarm.dev/v1alpha1"])
def test_jobs_are_accepted_in_every_supported_api_version(api_version: str) -> None:
    job = parse_manifest({**pull_job(), "apiVersion": api_version})
    assert job.api_version == api_version


def test_null_policies_and_parallelism_mean_the_defaults() -> None:
    # Given a manifest that spells out nulls, as Go's omitempty pointers allow
    job = parse_manifest(pull_job(parallelism=None, pullPolicy=None, completionPolicy=None))
    assert isinstance(job, ImagePullJob)
    assert job.spec.parallelism == 1
    assert job.spec.pull_policy.timeout_seconds == 600
    assert job.spec.completion_policy.type == "Always"


def test_kubectl_get_output_with_server_fields_and_status_loads_and_they_are_not_written_back() -> None:
    # Given what `kubectl get imagepulljob -o yaml` prints
    doc = pull_job()
    doc["metadata"].update(
        {
            "uid": "5c1b6a2e-0c1d-4a53-9d6e-2f0e1e7f4a10",
            "resourceVersion": "48211",
            "generation": 1,
            "creationTimestamp": "2024-05-01T10:00:00Z",
            "finalizers": ["apps.kruise.io/imagepulljob-protection"],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
        }
    )
    doc["status"] = {"desired": 3, "succeeded": 3, "message": "job has completed"}
    # When it is parsed and written back
    manifest = parse_manifest(doc).to_manifest()
    # Then the server-set fields and status are gone, the annotations kept
    assert manifest["metadata"] == {
        "name": "web",
        "namespace": "default",
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
    }
    assert "status" not in manifest


# --- Errors: shape --------------------------------------------------------------------------------


def test_validation_error_is_a_value_error_listing_field_paths() -> None:
    with pytest.raises(ValueError) as caught:
        parse_manifest(pull_job(parallelism=-1))
    error = caught.value
    assert isinstance(error, JobValidationError)
    assert error.errors == [FieldError("spec.parallelism", "must be greater than or equal to 0 (got -1)")]
    assert (
        str(error) == "ImagePullJob default/web is invalid: "
        "spec.parallelism: must be greater than or equal to 0 (got -1)"
    )


def test_all_problems_of_a_manifest_are_reported_together() -> None:
    # Given a manifest with three independent mistakes
    doc = pull_job(parallelism=-1, imagePullPolicy="Never")
    doc["metadata"]["namespace"] = "Team_A"
    # When it is validated
    with pytest.raises(JobValidationError) as caught:
        parse_manifest(doc)
    # Then each is listed on its own line under the job's name
    assert str(caught.value) == (
        "ImagePullJob Team_A/web is invalid:\n"
        f'  - metadata.namespace: "Team_A" {LABEL_RULE}\n'
        "  - spec.parallelism: must be greater than or equal to 0 (got -1)\n"
        '  - spec.imagePullPolicy: unsupported value "Never": supported values: "Always", "IfNotPresent"'
    )


def test_messages_never_use_pydantic_wording() -> None:
    doc = pull_job(parallelism="x", pullPolicy={"timeoutSeconds": "1"}, selector={"names": "n1"}, pullSecrets=[1])
    doc["metadata"]["labels"] = {"a": 1}
    for message in errors_of(doc):
        assert "Input should" not in message and "Value error" not in message


# --- Errors: top level ----------------------------------------------------------------------------


def test_unknown_kind_is_named() -> None:
    doc = {**pull_job(), "kind": "Deployment"}
    assert errors_of(doc) == [
        'kind: unsupported kind "Deployment": supported kinds are ImagePullJob, ImageListPullJob, PrewarmRule, '
        'WarmSnapshot, AdvancedCronJob'
    ]


def test_missing_kind_and_api_version_are_required() -> None:
    assert errors_of({"apiVersion": "apps.kruise.io/v1alpha1"}) == ["kind: required"]
    assert errors_of({"kind": "ImagePullJob"}) == ["apiVersion: required"]


def test_unsupported_api_version_names_the_supported_ones() -> None:
    assert errors_of({**pull_job(), "apiVersion": "apps.kruise.io/v2"}) == [
        'apiVersion: unsupported apiVersion "apps.kruise.io/v2" for kind ImagePullJob: use '
        '"apps.kruise.io/v1alpha1", "apps.kruise.io/v1beta1", "prewarm.dev/v1alpha1"'
    ]
    assert errors_of({**rule(), "apiVersion": "apps.kruise.io/v1alpha1"}) == [
        'apiVersion: unsupported apiVersion "apps.kruise.io/v1alpha1" for kind PrewarmRule: use "prewarm.dev/v1alpha1"'
    ]


def test_a_manifest_must_be_a_mapping() -> None:
    assert errors_of(["not", "a", "mapping"]) == ["a manifest must be a mapping with apiVersion and kind (got a list)"]


def test_unknown_fields_are_named_with_the_known_ones() -> None:
    assert errors_of(pull_job(paralelism=3)) == [
        'spec.paralelism: unknown field "paralelism"; known fields: pullSecrets, pullSecretsOnly, selector, '
        "podSelector, parallelism, pullPolicy, completionPolicy, sandboxConfig, imagePullPolicy, image"
    ]
    assert errors_of(pull_job(pullPolicy={"retries": 2})) == [
        'spec.pullPolicy.retries: unknown field "retries"; known fields: timeoutSeconds, backoffLimit'
    ]


def test_required_spec_and_metadata_name() -> None:
    assert errors_of({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob", "metadata": {}}) == [
        "metadata.name: required",
        "spec: required",
    ]


def test_name_must_be_a_dns_subdomain() -> None:
    doc = pull_job()
    doc["metadata"]["name"] = "Web_Job"
    assert errors_of(doc) == [f'metadata.name: "Web_Job" {SUBDOMAIN_RULE}']
    doc["metadata"]["name"] = "a" * 254
    assert errors_of(doc) == ["metadata.name: must be no more than 253 characters (got 254)"]


def test_metadata_label_keys_and_values_are_checked() -> None:
    doc = pull_job()
    doc["metadata"]["labels"] = {"team/": "x", "tier": "front end"}
    assert errors_of(doc) == [
        'metadata.labels[team/]: key "team/": name part must not be empty',
        f'metadata.labels[tier]: value "front end" {NAME_PART_RULE}',
    ]


# --- Errors: image(s) ----------------------------------------------------------------------------


def test_image_is_required_and_must_be_a_valid_reference() -> None:
    doc = pull_job()
    del doc["spec"]["image"]
    assert errors_of(doc) == ["spec.image: required"]
    assert errors_of(pull_job(image="")) == ["spec.image: must not be empty"]
    (message,) = errors_of(pull_job(image="NGINX:1.25"))
    assert message.startswith('spec.image: invalid image reference "NGINX:1.25": ')


def test_list_job_needs_between_one_and_255_images() -> None:
    assert errors_of(list_job([])) == ["spec.images: must list at least one image"]
    many = [f"registry.example.com/app-{index}:1.0" for index in range(256)]
    assert errors_of(list_job(many)) == ["spec.images: must list at most 255 images (got 256)"]
    assert isinstance(parse_manifest(list_job(many[:255])), ImageListPullJob)


def test_list_job_rejects_duplicate_images_including_spellings_of_the_same_image() -> None:
    images = ["nginx:1.25", "redis:7", "docker.io/library/nginx:1.25", "redis:7"]
    assert errors_of(list_job(images)) == [
        'spec.images[2]: duplicate image "docker.io/library/nginx:1.25" (same as [0] "nginx:1.25", '
        "both docker.io/library/nginx:1.25)",
        'spec.images[3]: duplicate image "redis:7" (same as [1])',
    ]


def test_list_job_names_the_index_of_an_invalid_image() -> None:
    (message,) = errors_of(list_job(["nginx:1.25", "redis:7", "busybox", "Bad Image"]))
    assert message.startswith('spec.images[3]: invalid image reference "Bad Image": ')


# --- Errors: selectors ---------------------------------------------------------------------------


def test_selector_names_and_labels_cannot_be_combined() -> None:
    assert errors_of(pull_job(selector={"names": ["n1"], "matchLabels": {"pool": "web"}})) == [
        "spec.selector: names cannot be combined with matchLabels or matchExpressions; use one"
    ]


def test_selector_names_must_be_distinct_node_names() -> None:
    assert errors_of(pull_job(selector={"names": ["n1", "n2", "n1", "N_3"]})) == [
        'spec.selector.names[2]: duplicate node name "n1" (also at [0])',
        f'spec.selector.names[3]: invalid node name: "N_3" {SUBDOMAIN_RULE}',
    ]


def test_pod_selector_cannot_be_combined_with_selector() -> None:
    assert errors_of(pull_job(selector={}, podSelector={"matchLabels": {"app": "web"}})) == [
        "spec.podSelector: cannot be combined with spec.selector; use one of them"
    ]


def test_expression_operators_need_values_exactly_when_kubernetes_does() -> None:
    expressions = [
        {"key": "zone", "operator": "In"},
        {"key": "zone", "operator": "NotIn", "values": []},
        {"key": "gpu", "operator": "Exists", "values": ["true"]},
        {"key": "spot", "operator": "DoesNotExist", "values": ["x"]},
        {"key": "arch", "operator": "Has"},
    ]
    assert errors_of(pull_job(selector={"matchExpressions": expressions})) == [
        "spec.selector.matchExpressions[0].values: must be non-empty when operator is In",
        "spec.selector.matchExpressions[1].values: must be non-empty when operator is NotIn",
        "spec.selector.matchExpressions[2].values: must be empty when operator is Exists",
        "spec.selector.matchExpressions[3].values: must be empty when operator is DoesNotExist",
        'spec.selector.matchExpressions[4].operator: unsupported value "Has": '
        'supported values: "In", "NotIn", "Exists", "DoesNotExist"',
    ]


def test_selector_keys_and_values_are_kubernetes_qualified_names_and_label_values() -> None:
    selector = {
        "matchLabels": {"-bad": "x"},
        "matchExpressions": [{"key": "Example.com/zone", "operator": "In", "values": ["a", "b c"]}],
    }
    assert errors_of(pull_job(podSelector=selector)) == [
        f'spec.podSelector.matchLabels[-bad]: key "-bad": name part {NAME_PART_RULE}',
        f'spec.podSelector.matchExpressions[0].key: key "Example.com/zone": prefix part "Example.com" {SUBDOMAIN_RULE}',
    ]
    assert errors_of(
        pull_job(podSelector={"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b c"]}]})
    ) == [f'spec.podSelector.matchExpressions[0].values[1]: value "b c" {NAME_PART_RULE}']


def test_unquoted_yaml_numbers_in_label_values_get_a_hint() -> None:
    doc = yaml.safe_load("spec: {selector: {matchLabels: {version: 1.20, canary: true}}}")
    assert errors_of(pull_job(**doc["spec"])) == [
        "spec.selector.matchLabels[version]: must be a string (got number 1.2); quote it in YAML",
        "spec.selector.matchLabels[canary]: must be a string (got boolean true); quote it in YAML",
    ]


# --- Errors: parallelism and policies -------------------------------------------------------------


def test_a_numeric_string_parallelism_is_that_number_as_kruise_reads_it() -> None:
    # Kruise's webhook parses the string (strconv.ParseInt) and its controller takes IntValue().
    for text, number in (("50", 50), ("0", 0), ("+3", 3), ("007", 7)):
        job = parse_manifest(pull_job(parallelism=text))
        assert isinstance(job, ImagePullJob) and job.spec.parallelism == number
    as_string, as_number = parse_manifest(pull_job(parallelism="50")), parse_manifest(pull_job(parallelism=50))
    assert as_string.spec_hash() == as_number.spec_hash()


def test_parallelism_zero_pauses_the_job() -> None:
    job = parse_manifest(pull_job(parallelism=0))
    assert isinstance(job, ImagePullJob) and job.spec.parallelism == 0


def test_parallelism_must_be_a_non_negative_integer_not_a_percentage() -> None:
    assert errors_of(pull_job(parallelism=-1)) == ["spec.parallelism: must be greater than or equal to 0 (got -1)"]
    assert errors_of(pull_job(parallelism="-1")) == ["spec.parallelism: must be greater than or equal to 0 (got -1)"]
    assert errors_of(pull_job(parallelism="50%")) == [
        'spec.parallelism: percentages such as "50%" are not supported: give a number of nodes such as 5 or "5"'
    ]
    assert errors_of(pull_job(parallelism="abc")) == [
        'spec.parallelism: must be a number of nodes such as 5 or "5" (got "abc")'
    ]
    assert errors_of(pull_job(parallelism="2147483648")) == [
        'spec.parallelism: must be a number of nodes such as 5 or "5" (got "2147483648")'
    ]
    assert errors_of(pull_job(parallelism=2.5)) == ["spec.parallelism: must be an integer (got number 2.5)"]
    assert errors_of(pull_job(parallelism=True)) == ["spec.parallelism: must be an integer (got boolean true)"]


def test_pull_policy_bounds() -> None:
    assert errors_of(pull_job(pullPolicy={"timeoutSeconds": 0, "backoffLimit": -1})) == [
        "spec.pullPolicy.timeoutSeconds: must be greater than or equal to 1 (got 0)",
        "spec.pullPolicy.backoffLimit: must be greater than or equal to 0 (got -1)",
    ]
    job = parse_manifest(pull_job(pullPolicy={"backoffLimit": 0}))
    assert isinstance(job, ImagePullJob) and job.spec.pull_policy.backoff_limit == 0


def test_completion_policy_type_is_always_or_never() -> None:
    assert errors_of(pull_job(completionPolicy={"type": "OnFailure"})) == [
        'spec.completionPolicy.type: unsupported value "OnFailure": supported values: "Always", "Never"'
    ]


def test_never_jobs_take_no_deadline_or_ttl() -> None:
    policy = {"type": "Never", "activeDeadlineSeconds": 3600, "ttlSecondsAfterFinished": 60}
    assert errors_of(pull_job(completionPolicy=policy)) == [
        f"spec.completionPolicy.activeDeadlineSeconds: {ALWAYS_ONLY}",
        f"spec.completionPolicy.ttlSecondsAfterFinished: {ALWAYS_ONLY}",
    ]


def test_active_deadline_must_cover_the_default_pull_timeout() -> None:
    assert errors_of(pull_job(completionPolicy={"activeDeadlineSeconds": 599})) == [
        "spec.completionPolicy.activeDeadlineSeconds: must be >= spec.pullPolicy.timeoutSeconds (600)"
    ]


def test_active_deadline_is_compared_with_the_given_pull_timeout() -> None:
    doc = pull_job(pullPolicy={"timeoutSeconds": 120}, completionPolicy={"activeDeadlineSeconds": 119})
    assert errors_of(doc) == [
        "spec.completionPolicy.activeDeadlineSeconds: must be >= spec.pullPolicy.timeoutSeconds (120)"
    ]
    doc["spec"]["completionPolicy"]["activeDeadlineSeconds"] = 120
    assert isinstance(parse_manifest(doc), ImagePullJob)


def test_list_job_template_follows_the_same_deadline_rule_its_children_will() -> None:
    assert errors_of(list_job(["nginx:1.25"], completionPolicy={"activeDeadlineSeconds": 60})) == [
        "spec.completionPolicy.activeDeadlineSeconds: must be >= spec.pullPolicy.timeoutSeconds (600)"
    ]


def test_image_pull_policy_is_always_or_if_not_present() -> None:
    assert errors_of(pull_job(imagePullPolicy="Never")) == [
        'spec.imagePullPolicy: unsupported value "Never": supported values: "Always", "IfNotPresent"'
    ]


def test_pull_secrets_are_secret_names() -> None:
    assert errors_of(pull_job(pullSecrets=["regcred", "Reg Cred"])) == [
        f'spec.pullSecrets[1]: invalid secret name: "Reg Cred" {SUBDOMAIN_RULE}'
    ]


def test_sandbox_config_takes_only_labels_and_annotations() -> None:
    assert errors_of(pull_job(sandboxConfig={"labels": {"a": "b"}, "runtimeHandler": "gvisor"})) == [
        'spec.sandboxConfig.runtimeHandler: unknown field "runtimeHandler"; known fields: labels, annotations'
    ]


# --- spec_hash ------------------------------------------------------------------------------------


def test_spec_hash_is_the_same_for_the_same_spec_written_differently() -> None:
    # Given the same spec, once with defaults spelled out and set-like lists in another order
    terse = pull_job(
        selector={"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
        pullSecrets=["one", "two"],
    )
    verbose = pull_job(
        selector={"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "a"]}]},
        pullSecrets=["two", "one"],
        parallelism=1,
        pullPolicy={"backoffLimit": 3, "timeoutSeconds": 600},
        completionPolicy={"type": "Always"},
        imagePullPolicy="IfNotPresent",
    )
    verbose["apiVersion"] = "apps.kruise.io/v1beta1"
    verbose["metadata"]["labels"] = {"owner": "me"}
    # Then the hashes agree
    assert parse_manifest(terse).spec_hash() == parse_manifest(verbose).spec_hash()


def test_spec_hash_changes_when_the_spec_changes() -> None:
    base = parse_manifest(pull_job()).spec_hash()
    assert parse_manifest(pull_job(parallelism=2)).spec_hash() != base
    assert parse_manifest(pull_job(image="nginx:1.26")).spec_hash() != base
    assert len(base) == 64


def test_list_job_hash_ignores_image_order() -> None:
    first = parse_manifest(list_job(["nginx:1.25", "redis:7"]))
    second = parse_manifest(list_job(["redis:7", "nginx:1.25"]))
    assert first.spec_hash() == second.spec_hash()


# --- child_jobs -----------------------------------------------------------------------------------


def test_list_job_yields_one_image_pull_job_per_image_with_the_template() -> None:
    # Given a list job with two images and a template
    parent = ImageListPullJob.from_manifest(
        list_job(["nginx:1.25", "redis:7"], parallelism=3, selector={"matchLabels": {"pool": "web"}})
    )
    # When its children are derived
    children = list(parent.child_jobs())
    # Then each pulls one image with the parent's template, namespace and apiVersion
    assert [child.spec.image for child in children] == ["nginx:1.25", "redis:7"]
    for child in children:
        assert child.api_version == parent.api_version
        assert child.namespace == "platform"
        assert child.name.startswith("base-") and len(child.name) == len("base-") + 10
        assert child.metadata.annotations == {LIST_JOB_ANNOTATION: "base"}
        assert child.spec.parallelism == 3
        assert child.spec.selector == parent.spec.selector
    assert len({child.name for child in children}) == 2


def test_child_names_do_not_depend_on_image_order() -> None:
    forward = ImageListPullJob.from_manifest(list_job(["nginx:1.25", "redis:7"]))
    backward = ImageListPullJob.from_manifest(list_job(["redis:7", "nginx:1.25"]))
    assert {c.spec.image: c.name for c in forward.child_jobs()} == {c.spec.image: c.name for c in backward.child_jobs()}


def test_child_names_stay_valid_for_the_longest_list_job_name() -> None:
    doc = list_job(["nginx:1.25"])
    doc["metadata"]["name"] = "a" * 250
    (child,) = ImageListPullJob.from_manifest(doc).child_jobs()
    assert len(child.name) == 253
    assert child.name.startswith("a" * 242 + "-")


# --- parse_manifests ------------------------------------------------------------------------------


def test_multi_document_yaml_skips_empty_documents_and_unpacks_lists() -> None:
    text = yaml.safe_dump_all(
        [pull_job(), None, {"apiVersion": "v1", "kind": "List", "items": [list_job(["redis:7"]), rule()]}]
    )
    kinds = [type(manifest) for manifest in parse_manifests(text)]
    assert kinds == [ImagePullJob, ImageListPullJob, PrewarmRule]


def test_invalid_yaml_is_reported_as_a_validation_error() -> None:
    with pytest.raises(JobValidationError) as caught:
        parse_manifests("spec: [unclosed")
    assert str(caught.value).startswith("invalid YAML: ")


def test_every_invalid_document_is_reported_with_its_position() -> None:
    bad_job = pull_job(parallelism=-1)
    bad_rule = copy.deepcopy(rule())
    bad_rule["spec"]["repositories"] = []
    text = yaml.safe_dump_all([bad_job, pull_job(), bad_rule])
    with pytest.raises(JobValidationError) as caught:
        parse_manifests(text)
    assert str(caught.value) == (
        "document 1 (ImagePullJob default/web) is invalid: "
        "spec.parallelism: must be greater than or equal to 0 (got -1)\n"
        "document 3 (PrewarmRule shop) is invalid: spec.repositories: must have at least 1 item(s)"
    )
    assert [error.path for error in caught.value.errors] == ["spec.parallelism", "spec.repositories"]


# --- PrewarmRule ----------------------------------------------------------------------------------


def test_rule_defaults_match_every_tag_but_not_untagged_pushes() -> None:
    shop = PrewarmRule.from_manifest(rule())
    assert shop.spec.tags == ["*"]
    assert shop.matches("shop/cart", "v1.0.0")
    assert not shop.matches("shop/cart", None)
    assert not shop.matches("shop/cart", "")
    assert not shop.matches("blog/web", "v1.0.0")


def test_rule_matches_repository_and_tag_globs() -> None:
    shop = PrewarmRule.from_manifest(rule(repositories=["shop/*", "edge"], tags=["v*.*.*", "release-?"]))
    assert shop.matches("shop/api/internal", "v2.3.4")
    assert shop.matches("edge", "release-7")
    assert not shop.matches("edge", "release-10")
    assert not shop.matches("shop/api", "latest")
    assert not shop.matches("Shop/api", "v2.3.4")


def test_rule_including_untagged_matches_untagged_pushes() -> None:
    models = PrewarmRule.from_manifest(rule(includeUntagged=True, tags=["prod-*"]))
    assert models.matches("shop/model", None)
    assert not models.matches("shop/model", "dev-1")


def test_rule_registry_filters_need_the_registry_to_match() -> None:
    scoped = PrewarmRule.from_manifest(rule(registries=["*.dkr.ecr.us-east-1.amazonaws.com"]))
    assert scoped.matches("shop/cart", "v1", registry=ECR)
    assert not scoped.matches("shop/cart", "v1", registry="123456789012.dkr.ecr.eu-west-1.amazonaws.com")
    # A rule limited to some registries cannot vouch for a push whose registry is unknown.
    assert not scoped.matches("shop/cart", "v1")


def test_rule_account_and_region_filters_read_the_ecr_host() -> None:
    scoped = PrewarmRule.from_manifest(rule(accountIds=["123456789012"], regions=["us-east-1", "us-west-2"]))
    assert scoped.matches("shop/cart", "v1", registry=ECR)
    assert scoped.matches("shop/cart", "v1", registry="123456789012.dkr.ecr.us-west-2.amazonaws.com")
    assert not scoped.matches("shop/cart", "v1", registry="210987654321.dkr.ecr.us-east-1.amazonaws.com")
    assert not scoped.matches("shop/cart", "v1", registry="ghcr.io")
    gov = PrewarmRule.from_manifest(rule(accountIds=["123456789012"], regions=["us-gov-west-1"]))
    assert gov.matches("shop/cart", "v1", registry="123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com")
    assert not gov.matches("shop/cart", "v1", registry="public.ecr.aws")


def test_rule_account_ids_must_be_quoted_strings() -> None:
    assert errors_of(rule(accountIds=[123456789012, "12345"], regions=["useast1"])) == [
        'spec.accountIds[0]: must be a 12-digit string such as "123456789012"; got number 123456789012; '
        "quote it in YAML",
        'spec.accountIds[1]: must be a 12-digit string such as "123456789012"; got string "12345"',
        'spec.regions[0]: "useast1" is not an AWS region name such as "us-east-1"',
    ]


def test_rule_template_must_complete() -> None:
    assert errors_of(rule(template={"spec": {"completionPolicy": {"type": "Never"}}})) == [
        "spec.template.spec.completionPolicy.type: must be Always: each push creates a job that must finish"
    ]


def test_rule_template_follows_the_job_rules_with_its_own_paths() -> None:
    template = {
        "metadata": {"namespace": "Shop"},
        "spec": {"completionPolicy": {"activeDeadlineSeconds": 10}},
    }
    assert errors_of(rule(template=template)) == [
        f'spec.template.metadata.namespace: "Shop" {LABEL_RULE}',
        "spec.template.spec.completionPolicy.activeDeadlineSeconds: must be >= "
        "spec.template.spec.pullPolicy.timeoutSeconds (600)",
    ]


def test_rule_template_takes_no_image() -> None:
    (message,) = errors_of(rule(template={"spec": {"image": "nginx"}}))
    assert message.startswith('spec.template.spec.image: unknown field "image"')


def test_job_for_push_pins_the_digest_and_uses_the_template() -> None:
    # Given the sample rule for shop releases
    (shop,) = parse_manifests((SAMPLES / "rules" / "shop-releases.yaml").read_text())
    assert isinstance(shop, PrewarmRule)
    # When a release is pushed
    job = shop.job_for_push(ECR, "shop/cart", DIGEST, tag="v1.4.0")
    # Then the job pulls exactly that digest, in the template's namespace, and finishes
    assert job.api_version == "prewarm.dev/v1alpha1"
    assert job.key == "shop/shop-releases-9f86d081884c"
    assert job.spec.image == f"{ECR}/shop/cart@{DIGEST}"
    assert job.spec.completion_policy.type == "Always"
    assert job.spec.completion_policy.ttl_seconds_after_finished == 86400
    assert job.spec.parallelism == 10
    assert job.metadata.labels == {"team": "shop"}
    assert job.metadata.annotations == {
        "prewarm.dev/rule": "shop-releases",
        "prewarm.dev/repository": "shop/cart",
        "prewarm.dev/tag": "v1.4.0",
    }


def test_a_rules_job_is_deleted_a_day_after_it_finished_unless_its_template_says_otherwise() -> None:
    # Given a rule whose template sets no TTL, and one that keeps its jobs an hour
    plain = PrewarmRule.from_manifest(rule())
    hour = PrewarmRule.from_manifest(rule(template={"spec": {"completionPolicy": {"ttlSecondsAfterFinished": 3600}}}))
    # When a push makes their jobs
    defaulted, kept = plain.job_for_push(ECR, "shop/cart", DIGEST), hour.job_for_push(ECR, "shop/cart", DIGEST)
    # Then finished jobs do not pile up: the first is deleted a day after it finished, the second as asked
    assert defaulted.spec.completion_policy.ttl_seconds_after_finished == 86_400
    assert kept.spec.completion_policy.ttl_seconds_after_finished == 3600
    assert defaulted.spec.completion_policy.type == kept.spec.completion_policy.type == "Always"


def test_job_for_an_untagged_push_has_no_tag_annotation() -> None:
    job = PrewarmRule.from_manifest(rule(includeUntagged=True)).job_for_push(ECR, "shop/cart", DIGEST)
    assert job.namespace == "default"
    assert "prewarm.dev/tag" not in (job.metadata.annotations or {})


def test_job_for_push_rejects_a_malformed_digest() -> None:
    shop = PrewarmRule.from_manifest(rule())
    with pytest.raises(JobValidationError) as caught:
        shop.job_for_push(ECR, "shop/cart", "sha256:abc")
    assert caught.value.errors[0].path == "digest"
    assert "64" in caught.value.errors[0].message


def test_job_names_from_long_rule_names_stay_valid() -> None:
    doc = rule()
    doc["metadata"]["name"] = "r" * 253
    job = PrewarmRule.from_manifest(doc).job_for_push(ECR, "shop/cart", DIGEST)
    assert len(job.name) == 253
    assert job.name.endswith("-9f86d081884c")


def test_rule_hash_is_stable_and_spec_sensitive() -> None:
    assert PrewarmRule.from_manifest(rule()).spec_hash() == PrewarmRule.from_manifest(rule()).spec_hash()
    assert PrewarmRule.from_manifest(rule()).spec_hash() != PrewarmRule.from_manifest(rule(tags=["v*"])).spec_hash()


def test_the_pin_annotation_is_true_or_false_and_reaches_the_pull_task() -> None:
    from prewarm.domain.job import ApiKind, StoredJob

    def job(pin: str | None) -> dict[str, Any]:
        annotations = {} if pin is None else {"prewarm.dev/pin": pin}
        return {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
                "metadata": {"name": "gpu", "namespace": "ml", "annotations": annotations},
                "spec": {"image": "r.example/team/model:v1", "selector": {"names": ["n1"]}}}

    pinned, unpinned, unset = parse_manifest(job("true")), parse_manifest(job("false")), parse_manifest(job(None))
    assert isinstance(pinned, ImagePullJob) and (pinned.pin, unpinned.pin, unset.pin) == (True, False, False)  # type: ignore[union-attr]
    with pytest.raises(JobValidationError, match=r'annotations.prewarm.dev/pin: must be "true" or "false", not .yes.'):
        parse_manifest(job("yes"))

    def stored(manifest: ImagePullJob) -> StoredJob:
        return StoredJob(namespace="ml", name="gpu", uid="u1", api_kind=ApiKind.IMAGE_PULL_JOB,
                         manifest=manifest.to_manifest(), spec_hash=manifest.spec_hash())

    task = stored(pinned).pull_task("n1")
    assert task.pin and '"pin":true' in task.model_dump_json()
    # Agents that predate the field never see it for a job that is not pinned.
    assert '"pin"' not in stored(unset).pull_task("n1").model_dump_json()  # type: ignore[arg-type]

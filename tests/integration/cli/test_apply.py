"""`prewarm apply`: kubectl's answers, every manifest source, and errors naming file, document and field."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import boto3
import pytest

from prewarm.domain.jobs import job_key
from prewarm.domain.warm_budgets import WarmBudget
from prewarm_devtools.account import ACCOUNT
from prewarm_devtools.sam.stack import LocalStack
from tests.support.cli import Run
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_yaml

pytestmark = pytest.mark.integration
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"

LIST_JOB = textwrap.dedent("""\
    apiVersion: apps.kruise.io/v1alpha1
    kind: ImageListPullJob
    metadata:
      name: base-images
    spec:
      images: [nginx:1.25, redis:7]
      parallelism: 2
    """)
RULE = textwrap.dedent("""\
    apiVersion: prewarm.dev/v1alpha1
    kind: PrewarmRule
    metadata:
      name: team-a
    spec:
      repositories: ["team-a/*"]
      tags: ["v*"]
      template:
        metadata:
          namespace: team-a
    """)


def test_applying_a_job_twice_is_unchanged_and_a_changed_spec_is_configured(
    prewarm: Run, tmp_path: Path, control_plane: ControlPlane
) -> None:
    # Given a job manifest
    manifest = tmp_path / "job.yaml"
    manifest.write_text(job_yaml("apply-web"))

    # When it is applied, applied again, then applied with another parallelism
    first = prewarm("apply", "-f", str(manifest))
    second = prewarm("apply", "-f", str(manifest))
    manifest.write_text(job_yaml("apply-web", parallelism=1))
    third = prewarm("apply", "-f", str(manifest))

    # Then kubectl's three answers come back, and the store holds the new spec
    assert (first.exit_code, first.stdout) == (0, "imagepulljob.apps.kruise.io/apply-web created\n")
    assert (second.exit_code, second.stdout) == (0, "imagepulljob.apps.kruise.io/apply-web unchanged\n")
    assert (third.exit_code, third.stdout) == (0, "imagepulljob.apps.kruise.io/apply-web configured\n")
    record = control_plane.store.get_job(job_key("default", "apply-web"))
    assert record is not None and record.manifest["spec"]["parallelism"] == 1 and record.generation == 2


def test_a_directory_applies_its_list_job_and_rule_files_in_name_order(
    prewarm: Run, tmp_path: Path, control_plane: ControlPlane
) -> None:
    # Given a directory with a list job, a rule and a file that is not a manifest
    (tmp_path / "a-list.yaml").write_text(LIST_JOB)
    (tmp_path / "b-rule.yml").write_text(RULE)
    (tmp_path / "notes.txt").write_text("not a manifest")

    # When the directory is applied
    result = prewarm("apply", "-f", str(tmp_path))

    # Then both objects are created, the list job with one child job per image
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "imagelistpulljob.apps.kruise.io/base-images created",
        "prewarmrule.prewarm.dev/team-a created",
    ]
    record = control_plane.store.get_job(job_key("default", "base-images"))
    assert record is not None and len(record.children) == 2
    assert [r["metadata"]["name"] for r in control_plane.store.list_rules()] == ["team-a"]


def test_recursive_reads_subdirectories(prewarm: Run, tmp_path: Path) -> None:
    # Given a manifest one directory down
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "job.yaml").write_text(job_yaml("apply-nested"))

    # When the top directory is applied without and with -R
    flat = prewarm("apply", "-f", str(tmp_path))
    recursive = prewarm("apply", "-R", "-f", str(tmp_path))

    # Then only the recursive run finds the job
    assert flat.exit_code == 2
    assert flat.stderr == "error: no objects passed to apply (see 'prewarm apply --help')\n"
    assert recursive.stdout == "imagepulljob.apps.kruise.io/apply-nested created\n"


def test_stdin_with_a_kind_list_applies_every_item(prewarm: Run) -> None:
    # Given a `kind: List` of two jobs on stdin, as `kubectl get -o yaml` writes it
    items = textwrap.indent(job_yaml("apply-stdin-1"), "    ").replace("    apiVersion", "  - apiVersion", 1)
    items += textwrap.indent(job_yaml("apply-stdin-2"), "    ").replace("    apiVersion", "  - apiVersion", 1)
    stream = f"apiVersion: v1\nkind: List\nitems:\n{items}"

    # When it is applied from `-`
    result = prewarm("apply", "-f", "-", input=stream)

    # Then both are created
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "imagepulljob.apps.kruise.io/apply-stdin-1 created",
        "imagepulljob.apps.kruise.io/apply-stdin-2 created",
    ]


def test_bad_yaml_exits_2_with_one_line_naming_the_file_and_line(prewarm: Run, tmp_path: Path) -> None:
    # Given a file that is not YAML
    bad = tmp_path / "broken.yaml"
    bad.write_text("apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata: {name: x\n")

    # When it is applied
    result = prewarm("apply", "-f", str(bad))

    # Then one error line names the file and where the YAML broke
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {bad}: invalid YAML at line 4, column 1: ")


def test_an_unknown_kind_exits_2_naming_the_kind(prewarm: Run, tmp_path: Path) -> None:
    # Given a Deployment
    manifest = tmp_path / "deploy.yaml"
    manifest.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {}\n")

    # When it is applied
    result = prewarm("apply", "-f", str(manifest))

    # Then the error names the file, the document, the field and the kind
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f'error: {manifest} document 1 (Deployment default/web): kind: unsupported kind "Deployment": '
        "supported kinds are ImagePullJob, ImageListPullJob, PrewarmRule, WarmSnapshot, AdvancedCronJob"
    ]


@pytest.mark.parametrize(("text", "got"), [
    ("just a string\n", 'string "just a string"'),
    ("- {apiVersion: prewarm.dev/v1alpha1, kind: ImagePullJob}\n", "a list"),
    ("kind: List\nitems: [42]\n", "number 42"),
])
def test_a_document_that_is_no_object_exits_2_naming_the_document(prewarm: Run, tmp_path: Path, text: str,
                                                                   got: str) -> None:
    # Given a file whose document is a plain string, a top-level list (without kind: List), or a List of a number
    manifest = tmp_path / "odd.yaml"
    manifest.write_text(text)

    # When it is applied
    result = prewarm("apply", "-f", str(manifest))

    # Then it is a usage error naming the document, not a crash
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    where = f"{manifest} document 1" + (", item 1" if "items" in text else "")
    assert line.startswith(f"error: {where}: a manifest must be a mapping with apiVersion and kind (got {got})")
    assert "Error" not in result.stderr


def test_a_missing_field_is_named_by_its_path(prewarm: Run, tmp_path: Path) -> None:
    # Given a job without spec.image and with a negative parallelism
    manifest = tmp_path / "job.yaml"
    manifest.write_text(job_yaml("apply-missing").replace("  image: nginx:1.25\n", "").replace(
        "parallelism: 3", "parallelism: -1"))

    # When it is applied
    result = prewarm("apply", "-f", str(manifest))

    # Then every problem is one line naming its field path
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"error: {manifest} document 1 (ImagePullJob default/apply-missing): spec.")
               for line in lines)
    assert any(line.endswith("spec.image: required") for line in lines)
    assert any("spec.parallelism: " in line for line in lines)


def test_valid_documents_are_applied_even_when_others_are_invalid(
    prewarm: Run, tmp_path: Path, control_plane: ControlPlane
) -> None:
    # Given one file with a valid job, an invalid job and another valid job, and a second broken file
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("---\n".join([
        job_yaml("apply-mix-1"),
        job_yaml("apply-mix-bad").replace("nginx:1.25", "'NGINX::bad'"),
        job_yaml("apply-mix-2"),
    ]))
    broken = tmp_path / "zz.yaml"
    broken.write_text("kind: [\n")

    # When both are applied
    result = prewarm("apply", "-f", str(mixed), "-f", str(broken))

    # Then the valid jobs are created, each bad document reported, and the exit code says invalid input
    assert result.exit_code == 2
    assert result.stdout.splitlines() == [
        "imagepulljob.apps.kruise.io/apply-mix-1 created",
        "imagepulljob.apps.kruise.io/apply-mix-2 created",
    ]
    errors = result.stderr.splitlines()
    assert len(errors) == 2
    assert errors[0].startswith(f"error: {mixed} document 2 (ImagePullJob default/apply-mix-bad): spec.image: ")
    assert errors[1].startswith(f"error: {broken}: invalid YAML")
    assert control_plane.store.get_job(job_key("default", "apply-mix-2")) is not None
    assert control_plane.store.get_job(job_key("default", "apply-mix-bad")) is None


def test_a_path_that_does_not_exist_is_a_usage_error(prewarm: Run, tmp_path: Path) -> None:
    # When a missing file is applied
    result = prewarm("apply", "-f", str(tmp_path / "nope.yaml"))

    # Then nothing is applied and one line says which path
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1
    assert "nope.yaml" in result.stderr and "does not exist" in result.stderr


def test_a_document_with_a_duplicate_key_is_refused_with_its_line_and_the_others_apply(
    prewarm: Run, tmp_path: Path, control_plane: ControlPlane
) -> None:
    # Given a file whose second document says `spec` twice (the second would silently win) and a nested
    # duplicate in the third
    manifest = tmp_path / "dup.yaml"
    second = job_yaml("apply-dup-bad") + "spec:\n  image: redis:7\n"
    third = job_yaml("apply-dup-nested").replace("  image: nginx:1.25\n", "  image: nginx:1.25\n  image: redis:7\n")
    manifest.write_text("---\n".join([job_yaml("apply-dup-1"), second, third, job_yaml("apply-dup-2")]))
    spec_line = 1 + len(job_yaml("apply-dup-1").splitlines()) + 1 + len(job_yaml("apply-dup-bad").splitlines())
    nested_line = next(i for i, line in enumerate(manifest.read_text().splitlines(), start=1)
                       if line == "  image: redis:7" and i > spec_line + 1)

    # When it is applied
    result = prewarm("apply", "-f", str(manifest))

    # Then the documents with a duplicate key are refused, naming the key and its line, and the others apply
    assert result.exit_code == 2
    assert result.stdout.splitlines() == [
        "imagepulljob.apps.kruise.io/apply-dup-1 created",
        "imagepulljob.apps.kruise.io/apply-dup-2 created",
    ]
    assert result.stderr.splitlines() == [
        f'error: {manifest} document 2: duplicate key "spec" at line {spec_line}',
        f'error: {manifest} document 3: duplicate key "image" at line {nested_line}',
    ]
    assert control_plane.store.get_job(job_key("default", "apply-dup-bad")) is None
    assert control_plane.store.get_job(job_key("default", "apply-dup-nested")) is None


def test_warm_snapshots_are_applied_listed_and_a_device_their_ami_family_does_not_use_is_refused(
    prewarm: Run, tmp_path: Path, control_plane: ControlPlane
) -> None:
    # Given the samples, and one naming a device Bottlerocket does not keep containerd on
    samples = Path(__file__).resolve().parents[3] / "samplefiles" / "warmsnapshots"
    bad = tmp_path / "bad.yaml"
    bad.write_text((samples / "gpu-karpenter.yaml").read_text().replace("name: gpu", "name: bad").replace(
        "deviceName: /dev/xvdb", "deviceName: /dev/xvdf"))
    # When they are applied, then listed
    applied = prewarm("apply", "-f", str(samples))
    refused = prewarm("apply", "-f", str(bad))
    listed = prewarm("get", "snapshots")
    # Then both samples are stored, the bad one is refused naming the field, and get lists them unbaked
    assert (applied.exit_code, applied.stdout) == (
        0, "warmsnapshot.prewarm.dev/gpu created\nwarmsnapshot.prewarm.dev/inference created\n")
    assert refused.exit_code == 2 and 'spec.dataVolume.deviceName: "/dev/xvdf" is not Bottlerocket' in refused.stderr
    assert [line.split()[:3] for line in listed.stdout.splitlines()] == [
        ["NAME", "NODE", "CLASS"], ["gpu", "EC2NodeClass/gpu", "<none>"],
        ["inference", "LaunchTemplate/lt-0abc1234def567890", "<none>"]]
    assert control_plane.store.get_warm_snapshot("bad") is None


def test_a_job_beyond_its_namespaces_warm_budget_is_refused_with_the_figures_and_exit_1(
    prewarm: Run, tmp_path: Path, control_plane: ControlPlane, local_stack: LocalStack,
) -> None:
    # Given a namespace with a warm budget of 1 MiB (as the resource sync copies it from the Namespace's
    # annotation), and two images in the stack's ECR of 600 KiB and 500 KiB (their compressed layers and config)
    control_plane.store.put_warm_budgets({"budgeted": WarmBudget("budgeted", 2**20)})
    ecr = boto3.client("ecr", endpoint_url=local_stack.endpoint_url, region_name=local_stack.region,
                       aws_access_key_id="local", aws_secret_access_key="local")
    ecr.create_repository(repositoryName="budget/app")
    host = f"{ACCOUNT}.dkr.ecr.{local_stack.region}.amazonaws.com/budget/app"
    for tag, size in (("a", 600 * 1024 - 100), ("b", 500 * 1024 - 100)):
        layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": size,
                 "digest": "sha256:" + hashlib.sha256(tag.encode()).hexdigest()}
        config = {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 100,
                  "digest": "sha256:" + hashlib.sha256(f"config {tag}".encode()).hexdigest()}
        ecr.put_image(repositoryName="budget/app", imageTag=tag, imageManifest=json.dumps(
            {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": [layer]}),
            imageManifestMediaType=OCI_MANIFEST)
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(job_yaml("warm-a", image=f"{host}:a", namespace="budgeted"))
    second.write_text(job_yaml("warm-b", image=f"{host}:b", namespace="budgeted"))

    # When one job is applied, then the other
    applied = prewarm("apply", "-f", str(first))
    refused = prewarm("apply", "-f", str(second))

    # Then the first fits; the second is refused, naming the namespace, the budget and both figures on the
    # fullest of the nodes both name
    assert (applied.exit_code, applied.stdout) == (0, "imagepulljob.apps.kruise.io/warm-a created\n")
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr == (
        f"error: {second} document 1: ImagePullJob budgeted/warm-b refused: namespace budgeted keeps at most "
        "1048576 bytes (1.0 MiB) of images warm per node; on node node-c its other jobs keep 614400 bytes and "
        "this job adds "
        "512000 bytes (policy Refuse; annotation prewarm.dev/warm-bytes-per-node)\n")
    assert control_plane.store.get_job(job_key("budgeted", "warm-b")) is None


def test_an_image_of_unknown_size_is_applied_with_a_warning_naming_it(
    prewarm: Run, tmp_path: Path, control_plane: ControlPlane,
) -> None:
    # Given a namespace with a warm budget, and a job of an image no registry can size at apply (not ECR)
    control_plane.store.put_warm_budgets({"sized": WarmBudget("sized", 2**20)})
    manifest = tmp_path / "job.yaml"
    manifest.write_text(job_yaml("warm-hub", image="nginx:1.25", namespace="sized"))

    # When it is applied
    result = prewarm("apply", "-f", str(manifest))

    # Then it is applied, and a warning says its size was not counted
    assert (result.exit_code, result.stdout) == (0, "imagepulljob.apps.kruise.io/warm-hub created\n")
    assert result.stderr == (f"Warning: {manifest} document 1: ImagePullJob sized/warm-hub: size unknown at apply, "
                             "not counted against the budget: docker.io/library/nginx:1.25\n")

"""The WarmSnapshot declaration (prewarm.domain.snapshots) and the builder's user data
(prewarm.domain.builders): each bad field is refused naming it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from prewarm.domain.builders import BuilderUserDataError, bake_document, builder_user_data, read_bake_document
from prewarm.domain.kubernetes import JobValidationError
from prewarm.domain.manifests import parse_manifest
from prewarm.domain.snapshots import AmiFamily, WarmSnapshot

BASE: dict[str, Any] = {
    "apiVersion": "prewarm.dev/v1alpha1", "kind": "WarmSnapshot", "metadata": {"name": "gpu"},
    "spec": {"nodeClass": {"ec2NodeClass": "gpu"}, "amiFamily": "Bottlerocket", "rules": ["ml"]}}


def with_spec(**spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec)
    return doc


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(JobValidationError) as e:
        parse_manifest(doc)
    return [str(p) for p in e.value.errors]


def test_a_warm_snapshot_is_read_with_its_defaults_and_fast_restore_cost() -> None:
    ws = parse_manifest(with_spec(fastSnapshotRestore={"availabilityZones": ["us-west-2a", "us-west-2b"]}))
    assert isinstance(ws, WarmSnapshot)
    assert ws.spec.data_volume.device_name == "/dev/xvdb" and ws.spec.keep == 2
    assert ws.spec.node_class.describe() == "EC2NodeClass/gpu"
    assert ws.fsr_dollars_per_hour() == 1.5  # $0.75 per snapshot and AZ hour
    # No builder override: the node class says where the builder launches (domain/launch_sources.py).
    assert ws.spec.builder.image_id is None and ws.spec.builder.subnet_ids == []
    assert ws.wants("r/x:1", ["ml"]) and not ws.wants("r/x:1", ["web"])


@pytest.mark.parametrize(("spec", "expected"), [
    ({"dataVolume": {"deviceName": "/dev/xvdc"}},
     'spec.dataVolume.deviceName: "/dev/xvdc" is not Bottlerocket\'s data volume'),
    ({"amiFamily": "AL2023", "dataVolume": {"deviceName": "/dev/xvda", "mountPath": "/var/lib/containerd"}},
     'spec.dataVolume.deviceName: "/dev/xvda" is not a secondary volume of AL2023'),
    ({"amiFamily": "AL2023"}, "spec.dataVolume.mountPath: must be /var/lib/containerd on AL2023"),
    ({"amiFamily": "Ubuntu"}, 'spec.amiFamily: "Ubuntu" is not an AMI family Prewarm bakes'),
    ({"nodeClass": {"ec2NodeClass": "a", "launchTemplate": "lt-0123456789abcdef0"}},
     "spec.nodeClass: set exactly one of ec2NodeClass (Karpenter) and launchTemplate"),
    ({"rules": [], "images": []}, "spec: name at least one of rules"),
    ({"images": ["Bad Image"]}, "spec.images[0]"),
    ({"fastSnapshotRestore": {"availabilityZones": ["us-west-2"]}},
     'spec.fastSnapshotRestore.availabilityZones[0]: "us-west-2" is not an Availability Zone name'),
    ({"builder": {"subnetIds": ["sn-1"]}}, 'spec.builder.subnetIds[0]: "sn-1" is not a subnet id'),
    ({"keep": 0}, "spec.keep"),
])
def test_a_bad_field_is_refused_naming_it(spec: dict[str, Any], expected: str) -> None:
    found = problems(with_spec(**spec))
    assert any(expected in p for p in found), found


def test_an_al2023_secondary_volume_and_a_launch_template_are_accepted() -> None:
    ws = parse_manifest(with_spec(amiFamily="AL2023", nodeClass={"launchTemplate": "lt-0123456789abcdef0"},
                                  dataVolume={"deviceName": "/dev/xvdb", "mountPath": "/var/lib/containerd"}))
    assert isinstance(ws, WarmSnapshot) and ws.spec.node_class.kind == "LaunchTemplate"


@pytest.mark.parametrize("family", list(AmiFamily))
def test_the_builders_user_data_carries_the_bake_for_each_family(family: AmiFamily) -> None:
    document = bake_document("gpu-1", "gpu", ["r/x:1"], "https://sqs/q", "us-west-2")
    user_data = builder_user_data(family, "agent:1", document, "/dev/xvdb")
    assert read_bake_document(user_data) == document
    assert ("superpowered = true" in user_data) == (family is AmiFamily.BOTTLEROCKET)


def test_user_data_without_a_bake_is_refused() -> None:
    with pytest.raises(BuilderUserDataError, match="carries no bake document"):
        read_bake_document("#!/bin/bash\necho hi\n")
    with pytest.raises(BuilderUserDataError, match="not base64 JSON"):
        read_bake_document('user-data = "%%%"')

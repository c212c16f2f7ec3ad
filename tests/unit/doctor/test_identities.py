"""Where the doctor finds a function role's Kubernetes identity on EKS: its access entry, or the
`aws-auth` ConfigMap's `mapRoles`, as the cluster's authentication mode has EKS look."""

from __future__ import annotations

import json
from typing import Any

from prewarm_cli.doctor.identities import AccessEntry, EksAccessEntries, LocalAccessEntries

ROLE = "arn:aws:iam::111122223333:role/prewarm-SweepRole-AbC"
MAPPED = "arn:aws:iam::111122223333:role/prewarm-RecordStatusRole-DeF"
AWS_AUTH = {"data": {"mapRoles": f"- rolearn: {MAPPED}\n  username: prewarm-record-status\n"
                                 "  groups: [prewarm-control-plane]\n"}}


class NotFoundError(Exception):
    pass


class FakeEks:
    """`describe_cluster` with an authentication mode and `describe_access_entry` over `entries`."""

    class exceptions:
        ResourceNotFoundException = NotFoundError

    def __init__(self, mode: str, entries: dict[str, list[str]]) -> None:
        self.mode = mode
        self.entries = entries
        self.calls: list[str] = []

    def describe_cluster(self, name: str) -> dict[str, Any]:
        self.calls.append("DescribeCluster")
        return {"cluster": {"name": name, "accessConfig": {"authenticationMode": self.mode}}}

    def describe_access_entry(self, clusterName: str, principalArn: str) -> dict[str, Any]:
        self.calls.append("DescribeAccessEntry")
        if principalArn not in self.entries:
            raise NotFoundError(principalArn)
        return {"accessEntry": {"principalArn": principalArn, "kubernetesGroups": self.entries[principalArn],
                                "username": f"{principalArn}/{{{{SessionName}}}}"}}


def source(mode: str, read: list[str]) -> tuple[EksAccessEntries, FakeEks]:
    eks = FakeEks(mode, {ROLE: ["prewarm-control-plane"]})

    def read_config_map(namespace: str, name: str) -> dict[str, Any]:
        read.append(f"{namespace}/{name}")
        return AWS_AUTH

    return EksAccessEntries(eks, "prod", read_config_map), eks


def test_in_api_mode_only_access_entries_count() -> None:
    read: list[str] = []
    entries, _ = source("API", read)

    assert entries.entry(ROLE) == AccessEntry(f"{ROLE}/{{{{SessionName}}}}", ("prewarm-control-plane",))
    assert entries.entry(MAPPED) is None
    assert read == [] and entries.where == "the access entries of EKS cluster prod"
    assert entries.fix(MAPPED, ["prewarm-control-plane"]) == (
        f"`aws eks create-access-entry --cluster-name prod --principal-arn {MAPPED} "
        "--kubernetes-groups prewarm-control-plane`, or deploy with ClusterAccess=access-entries")


def test_in_api_and_config_map_mode_aws_auth_answers_for_a_role_without_an_entry() -> None:
    read: list[str] = []
    entries, _ = source("API_AND_CONFIG_MAP", read)

    assert entries.entry(ROLE) is not None and read == []
    assert entries.entry(MAPPED) == AccessEntry("prewarm-record-status", ("prewarm-control-plane",))
    assert read == ["kube-system/aws-auth"]


def test_in_config_map_mode_access_entries_are_not_asked() -> None:
    read: list[str] = []
    entries, eks = source("CONFIG_MAP", read)

    assert entries.entry(ROLE) is None
    assert entries.entry(MAPPED) == AccessEntry("prewarm-record-status", ("prewarm-control-plane",))
    assert eks.calls == ["DescribeCluster"] and read == ["kube-system/aws-auth"]  # read once
    assert entries.fix(ROLE, ["prewarm-control-plane"]).startswith("map the role in aws-auth")


def test_local_mode_reads_its_entries_from_the_state() -> None:
    entries = LocalAccessEntries({"LOCAL_ACCESS_ENTRIES": json.dumps({ROLE: ["prewarm-control-plane"]})})
    assert entries.entry(ROLE) == AccessEntry("", ("prewarm-control-plane",))
    assert entries.entry(MAPPED) is None

"""KEP-2535 as the doctor and describe see it: the kubelet's policy read from `/configz`, whether it lets any
pod use an image the agent warmed, and the doctor's `image credentials` line."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.domain.verification import (
    KubeletConfigError,
    KubeletImagePolicy,
    VerificationPolicy,
    pulls_with_shared_credentials,
    warm_credentials,
)
from prewarm.services.ports import ClusterAuthError, ClusterNotFoundError, ClusterUnavailableError
from prewarm_cli.doctor.checks import check_image_credentials
from prewarm_cli.kubelets import NodePolicies, read_policies, read_pool_policies

ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
PRIVATE = f"{ECR}/team/app:v1"


def configz(policy: str | None = None, allowlist: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"enableServer": True, **extra}
    if policy is not None:
        config["imagePullCredentialsVerificationPolicy"] = policy
    if allowlist is not None:
        config["preloadedImagesVerificationAllowlist"] = allowlist
    return {"kubeletconfig": config}


# --- the policy ---------------------------------------------------------------------------------


def test_each_policy_says_whether_any_pod_may_use_an_agent_warmed_image() -> None:
    def lets(doc: dict[str, Any], image: str | None = PRIVATE) -> bool:
        return KubeletImagePolicy.from_configz(doc).lets_any_pod_use(image)

    assert lets(configz("NeverVerify"))
    # The agent pulls through the CRI: the kubelet has no pull record, so the image is "preloaded"
    assert lets(configz("NeverVerifyPreloadedImages"))
    assert not lets(configz("AlwaysVerify"))
    # Before 1.35 (or with the gate off) the field is absent and nothing is checked
    assert lets(configz())
    assert lets(configz("NeverVerifyPreloadedImages", featureGates={"KubeletEnsureSecretPulledImages": False}))
    # A value from a newer kubelet is read as letting them: the warning errs on the safe side
    assert lets(configz("VerifyOnTuesdays"))


def test_the_allowlist_matches_as_the_kubelet_does() -> None:
    policy = KubeletImagePolicy.from_configz(configz("NeverVerifyAllowlistedImages",
                                                     [f"{ECR}/base/*", "docker.io/library/busybox"]))
    assert policy.policy is VerificationPolicy.NEVER_VERIFY_ALLOWLISTED
    assert policy.lets_any_pod_use(f"{ECR}/base/python:3.12")
    assert policy.lets_any_pod_use(f"{ECR}/base/ml/torch@sha256:" + "a" * 64)
    assert policy.lets_any_pod_use("busybox:1.36")  # normalised: docker.io/library/busybox
    assert not policy.lets_any_pod_use(PRIVATE)
    assert not policy.lets_any_pod_use(f"{ECR}/basement/app:v1")  # a prefix ends at a slash
    # A rule's next image may be any: exposed when the allowlist names something
    assert policy.lets_any_pod_use(None)
    assert not KubeletImagePolicy.from_configz(configz("NeverVerifyAllowlistedImages", [])).lets_any_pod_use(None)


def test_an_answer_that_is_not_a_kubelet_configuration_is_an_error() -> None:
    with pytest.raises(KubeletConfigError, match='no "kubeletconfig" object'):
        KubeletImagePolicy.from_configz({"kind": "Status"})
    with pytest.raises(KubeletConfigError, match="preloadedImagesVerificationAllowlist is not a list of strings"):
        KubeletImagePolicy.from_configz(configz("NeverVerifyAllowlistedImages", allowlist="x/*"))  # type: ignore[arg-type]


def test_shared_credentials_are_the_ones_the_agent_uses_for_private_ecr_hosts() -> None:
    assert pulls_with_shared_credentials(PRIVATE, pull_secrets_only=False)
    assert not pulls_with_shared_credentials(PRIVATE, pull_secrets_only=True)
    assert not pulls_with_shared_credentials("public.ecr.aws/docker/library/busybox:1.36", False)
    assert not pulls_with_shared_credentials("ghcr.io/team/app:v1", False)
    assert warm_credentials(PRIVATE, [], False) == "shared"
    assert warm_credentials(PRIVATE, ["regcred"], True) == "own"
    assert warm_credentials("ghcr.io/team/app:v1", ["regcred"], False) == "own"
    assert warm_credentials("busybox", [], False) == "none"


# --- reading the nodes --------------------------------------------------------------------------


class Configz:
    def __init__(self, answers: dict[str, dict[str, Any] | Exception]) -> None:
        self.answers = answers
        self.read: list[str] = []

    def get_node_configz(self, name: str) -> dict[str, Any]:
        self.read.append(name)
        found = self.answers[name]
        if isinstance(found, Exception):
            raise found
        return found


def test_unreadable_nodes_are_reported_with_their_reason_not_left_out() -> None:
    found = read_policies(Configz({
        "a": configz("AlwaysVerify"),
        "b": ClusterAuthError('nodes "b" is forbidden: ...', status=403, reason="Forbidden"),
        "c": ClusterUnavailableError("503 ServiceUnavailable: error trying to reach service", status=503),
        "d": ClusterNotFoundError('nodes "d" not found', status=404),
        "e": {"kind": "Status"},
    }), ["a", "b", "c", "d", "e"])

    assert set(found.policies) == {"a"}
    assert found.unreadable == {
        "b": "forbidden: no get on nodes/proxy",
        "c": "kubelet not reached: 503 ServiceUnavailable: error trying to reach service",
        "d": "node not found",
        "e": 'no kubelet configuration: the answer has no "kubeletconfig" object',
    }
    assert found.forbidden


def node(name: str, version: str = "v1.34.1-eks-1", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "status": {"nodeInfo": {"kubeletVersion": version}}}


NODEGROUP, NODEPOOL = "eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"


def test_the_doctor_reads_one_kubelet_per_node_pool_and_gives_its_policy_to_the_pool() -> None:
    fleet = [
        *(node(f"ng-{i}", **{NODEGROUP: "web", INSTANCE_TYPE: "m7g.large"}) for i in range(40)),
        *(node(f"kp-{i}", **{NODEPOOL: "gpu", INSTANCE_TYPE: "g5.xlarge"}) for i in range(30)),
        # A pool being upgraded: two kubelet versions, two configurations
        *(node(f"kp-new-{i}", "v1.35.0-eks-1", **{NODEPOOL: "gpu"}) for i in range(5)),
        *(node(f"self-{i}", **{INSTANCE_TYPE: "c7g.large"}) for i in range(10)),  # no pool label
    ]
    answers: dict[str, dict[str, Any] | Exception] = {
        n["metadata"]["name"]: configz("AlwaysVerify") for n in fleet}
    answers["kp-0"] = configz("NeverVerify")
    api = Configz(answers)

    found = read_pool_policies(api, fleet)

    assert sorted(api.read) == ["kp-0", "kp-new-0", "ng-0", "self-0"]
    assert len(found.policies) == 85 and not found.unreadable
    assert {n for n, p in found.policies.items() if p.lets_any_pod_use(PRIVATE)} == {f"kp-{i}" for i in range(30)}
    assert found.sampled == {
        "eks.amazonaws.com/nodegroup=web, kubelet v1.34.1-eks-1": "ng-0",
        "karpenter.sh/nodepool=gpu, kubelet v1.34.1-eks-1": "kp-0",
        "karpenter.sh/nodepool=gpu, kubelet v1.35.0-eks-1": "kp-new-0",
        "node.kubernetes.io/instance-type=c7g.large, kubelet v1.34.1-eks-1": "self-0",
    }


def test_a_pool_whose_sampled_node_is_unreachable_is_read_from_the_next_and_rbac_ends_the_pool() -> None:
    web = [node(f"web-{i}", **{NODEGROUP: "web"}) for i in range(5)]
    batch = [node(f"batch-{i}", **{NODEGROUP: "batch"}) for i in range(5)]
    answers: dict[str, dict[str, Any] | Exception] = {n["metadata"]["name"]: configz("AlwaysVerify") for n in web}
    answers["web-0"] = ClusterUnavailableError("503 ServiceUnavailable: error trying to reach service", status=503)
    answers |= {n["metadata"]["name"]: ClusterAuthError("forbidden", status=403, reason="Forbidden") for n in batch}
    api = Configz(answers)

    found = read_pool_policies(api, web + batch)

    assert sorted(api.read) == ["batch-0", "web-0", "web-1"]
    assert set(found.policies) == {f"web-{i}" for i in range(5)}
    assert found.unreadable == {f"batch-{i}": "forbidden: no get on nodes/proxy" for i in range(5)}
    result = check_image_credentials(["job team-a/web"], [PRIVATE], found)
    assert result.detail.endswith("; read from 1 node(s), one per pool of 2")


# --- the doctor's line --------------------------------------------------------------------------


def policies(**nodes: str | None) -> NodePolicies:
    return NodePolicies({n: KubeletImagePolicy.from_configz(configz(p)) for n, p in nodes.items()})


def test_shared_warms_on_permissive_nodes_are_a_warning_naming_jobs_nodes_and_the_fix() -> None:
    result = check_image_credentials(["job team-a/web", "rule shop"], [PRIVATE, None],
                                     policies(n1="NeverVerifyPreloadedImages", n2="AlwaysVerify", n3=None))

    assert result.warning and not result.failed
    assert result.line() == (
        "warn  image credentials: job team-a/web, rule shop warm private ECR images with shared "
        "credentials: any pod of 2 of 3 nodes may use them without credentials of its own (NeverVerifyPreloadedImages "
        "on n1; not enforced (kubelet before 1.35, or feature gate KubeletEnsureSecretPulledImages off) on n3): "
        "set the kubelets' imagePullCredentialsVerificationPolicy to AlwaysVerify (warm layers stay useful), or give "
        "these jobs spec.pullSecretsOnly with their own pull secrets (docs/credentials.md)")


def test_every_node_verifying_is_ok() -> None:
    result = check_image_credentials(["job team-a/web"], [PRIVATE], policies(n1="AlwaysVerify", n2="AlwaysVerify"))

    assert result.line() == ("ok    image credentials: job team-a/web warms private ECR images with "
                             "shared credentials, and every node's kubelet verifies them (AlwaysVerify on 2)")


def test_nothing_warmed_with_shared_credentials_needs_no_node_read() -> None:
    assert check_image_credentials([], [], NodePolicies()).line() == (
        "ok    image credentials: no job or rule warms a private ECR image with shared credentials")


def test_nodes_the_caller_may_not_read_are_a_warning_with_the_rbac_fix() -> None:
    found = policies(n1="AlwaysVerify")
    found.unreadable = {"n2": "forbidden: no get on nodes/proxy", "n3": "forbidden: no get on nodes/proxy"}

    result = check_image_credentials(["job team-a/web"], [PRIVATE], found)

    assert result.warning
    assert result.detail == "the kubelet policy of 2 nodes is unknown (n2, n3: forbidden: no get on nodes/proxy)"
    assert result.fix.startswith("grant `get` on `nodes/proxy` to whoever runs this")

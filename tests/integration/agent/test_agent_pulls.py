"""The agent end to end at full speed: real SQS messages (moto), real pulls into a private containerd
from local registries, reports read back from the status queue."""

from __future__ import annotations

import json
import logging
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from prewarm.adapters.ecr_auth import EcrTokenSource
from prewarm.adapters.secrets import SecretsManagerCredentialStore
from prewarm.domain.messages import PullTask
from prewarm.domain.refresh import RegistryToken, registry_secret_name
from prewarm.domain.runtimes import ContainerRuntime
from prewarm_agent.cri.client import CriImageClient
from prewarm_agent.cri.errors import ImagePullError
from prewarm_agent.cri.pinning import PINNED_LABEL, ImageNotFoundError, ImagePins
from prewarm_devtools.kubeapi.server import KubeApiServer
from prewarm_devtools.node.containerd import PrivateContainerd
from prewarm_devtools.node.images import RegistryPusher, host_architecture
from prewarm_devtools.node.kubelet_gc import collect_images
from prewarm_devtools.node.registry import LocalRegistry
from prewarm_devtools.pytest_plugins.node import (
    AUTH_PASSWORD,
    AUTH_USERNAME,
    REFUSED_WITHOUT_CREDENTIALS,
    OciImageFactory,
)
from prewarm_devtools.sam.aws import MotoServer
from tests.support.agent_harness import AgentHarness
from tests.support.cri_pods import CriPods, install_sandbox_image, missing_tools, runnable_image
from tests.support.waiting import eventually

pytestmark = [pytest.mark.node, pytest.mark.integration]

Agents = Callable[..., AgentHarness]
ECR_ACCOUNT = "123456789012"
ECR_HOST = f"{ECR_ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com"


def _pull_secret(aws: MotoServer, host: str, username: str, password: str) -> str:
    """A Secrets Manager secret holding a docker config for `host`; returns its ARN."""
    config = {"auths": {host: {"username": username, "password": password}}}
    created = aws.client("secretsmanager").create_secret(
        Name=f"prewarm/pull-secrets/default/regcred-{uuid.uuid4().hex[:8]}", SecretString=json.dumps(config)
    )
    return str(created["ARN"])


def _http_get(agent: AgentHarness, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{agent.agent.http_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# --- pulls -------------------------------------------------------------------------------------------


def test_pull_by_tag_reports_pulling_then_succeeded_and_deletes_the_message(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory, cri: CriImageClient
) -> None:
    # Given an agent and an image the node does not have
    image = oci_image_factory.push(registry, "agent/by-tag", "v1")
    agent = agents()
    task = agent.task(image.reference, sandbox_labels={"team": "api"})

    # When its task arrives on the node queue
    agent.send(task)
    final = agent.final(task)

    # Then it reports Pulling (again with its progress, should the pull outlast a progress tick on a loaded
    # machine), then Succeeded with what the runtime now holds
    reports = agent.reports(task)
    assert [r.phase for r in reports] == ["Pulling"] * (len(reports) - 1) + ["Succeeded"] and len(reports) >= 2
    # seq numbers on from the time the run started (ms), one per report
    assert [r.seq - reports[0].seq for r in reports] == list(range(len(reports)))
    assert reports[0].seq > 1_600_000_000_000
    assert all((r.job, r.round, r.node, r.attempt) == (task.job, 0, agent.node, 1) for r in reports)
    assert final.image_id == image.config_digest
    assert final.repo_digest == f"{registry.host}/agent/by-tag@{image.manifest_digest}"
    assert final.size_bytes and final.size_bytes > 0
    assert final.bytes_total == sum(image.layer_sizes) == final.bytes_done
    assert final.started_at is not None and final.finished_at is not None
    assert final.started_at <= final.finished_at
    status = cri.image_status(image.reference)
    assert status is not None and status.id == image.config_digest
    # ... and the task message is gone from the queue
    assert eventually(lambda: agent.queue_depth() == (0, 0), timeout=5)


def test_pull_by_digest(agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory) -> None:
    image = oci_image_factory.push(registry, "agent/by-digest", "v1")
    agent = agents()
    task = agent.task(image.digest_reference)

    agent.send(task)

    final = agent.final(task)
    assert final.phase == "Succeeded", final.message
    assert final.image_id == image.config_digest
    assert final.repo_digest == image.digest_reference


def test_if_not_present_skips_the_pull_of_a_present_image(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory, cri: CriImageClient
) -> None:
    # Given an image already on the node
    image = oci_image_factory.push(registry, "agent/present", "v1")
    cri.pull_image(image.reference).result(timeout=30)
    agent = agents()
    task = agent.task(image.reference, image_pull_policy="IfNotPresent")

    # When an IfNotPresent task for it arrives
    agent.send(task)
    final = agent.final(task)

    # Then it succeeds at once without a pull: no Pulling report, no attempt, no PullImage call
    assert [r.phase for r in agent.reports(task)] == ["Succeeded"]
    assert final.attempt == 0
    assert final.message == "image already present"
    assert final.image_id == image.config_digest
    assert agent.metric("prewarm_agent_pull_calls_total") == 0


def test_always_pulls_again_and_picks_up_a_moved_tag(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory, cri: CriImageClient
) -> None:
    # Given v1 on the node, then the tag pushed again with a different image
    old = oci_image_factory.push(registry, "agent/always", "v1")
    cri.pull_image(old.reference).result(timeout=30)
    new = oci_image_factory.push(registry, "agent/always", "v1")
    assert new.config_digest != old.config_digest
    agent = agents()
    task = agent.task(new.reference, image_pull_policy="Always")

    # When an Always task arrives
    agent.send(task)
    final = agent.final(task)

    # Then it pulled (Pulling reported, once more per progress tick the pull outlasts) and the node now has
    # the tag's new image
    phases = [r.phase for r in agent.reports(task)]
    assert phases == ["Pulling"] * (len(phases) - 1) + ["Succeeded"] and len(phases) >= 2
    assert final.image_id == new.config_digest
    status = cri.image_status(new.reference)
    assert status is not None and status.id == new.config_digest


def test_index_without_this_platform_fails_with_the_runtime_reason(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    other = "s390x" if host_architecture() != "s390x" else "ppc64le"
    image = oci_image_factory.push_index(registry, "agent/foreign", architectures=[other])
    agent = agents()
    task = agent.task(image.reference)

    agent.send(task)

    final = agent.final(task)
    assert final.phase == "Failed"
    assert "no match for platform in manifest" in final.message
    assert final.attempt == 1


def test_invalid_image_reference_fails_naming_the_part_at_fault(agents: Agents) -> None:
    agent = agents()
    task = agent.task("registry.example.com/Team/App:v1")

    agent.send(task)

    final = agent.final(task)
    assert final.phase == "Failed"
    assert final.message == (
        'invalid image reference "registry.example.com/Team/App:v1": repository name must be lowercase'
    )


# --- credentials -------------------------------------------------------------------------------------


def test_pull_secret_with_the_right_credentials_pulls_from_a_private_registry(
    agents: Agents, aws: MotoServer, auth_registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(auth_registry, "private/app", "v1")
    arn = _pull_secret(aws, auth_registry.host, AUTH_USERNAME, AUTH_PASSWORD)
    agent = agents()
    task = agent.task(image.reference, pull_secret_arns=[arn])

    agent.send(task)

    final = agent.final(task)
    assert final.phase == "Succeeded", final.message
    assert final.image_id == image.config_digest


def test_a_refused_credential_moves_on_to_the_next_matching_one(
    agents: Agents, aws: MotoServer, auth_registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given two secrets that both match the image: the more specific key holds a wrong password
    image = oci_image_factory.push(auth_registry, "private/ordered", "v1")
    wrong = _pull_secret(aws, f"{auth_registry.host}/private", AUTH_USERNAME, "stale-password")
    right = _pull_secret(aws, auth_registry.host, AUTH_USERNAME, AUTH_PASSWORD)
    agent = agents()
    task = agent.task(image.reference, pull_secret_arns=[wrong, right])

    # When the task runs
    agent.send(task)

    # Then the registry's 401 for the first sends the pull on to the second, within one attempt
    final = agent.final(task)
    assert final.phase == "Succeeded", final.message
    assert final.attempt == 1
    assert agent.metric("prewarm_agent_pull_calls_total") == 2


def test_wrong_credentials_fail_with_the_runtime_error_verbatim_and_no_secret_logged(
    agents: Agents,
    aws: MotoServer,
    auth_registry: LocalRegistry,
    oci_image_factory: OciImageFactory,
    cri: CriImageClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a pull secret with a wrong password
    caplog.set_level(logging.DEBUG)
    image = oci_image_factory.push(auth_registry, "private/wrong", "v1")
    password = f"wrong-{uuid.uuid4().hex}"
    arn = _pull_secret(aws, auth_registry.host, AUTH_USERNAME, password)
    agent = agents()
    task = agent.task(image.reference, pull_secret_arns=[arn])

    # When the task runs
    agent.send(task)
    final = agent.final(task)

    # Then it fails with exactly what containerd says for that pull
    with pytest.raises(ImagePullError) as direct:
        cri.pull_image(image.reference, auth=(AUTH_USERNAME, password)).result(timeout=30)
    assert final.phase == "Failed"
    assert final.message == direct.value.details
    assert "401 Unauthorized" in final.message
    # ... and the password appears in no log line and no report
    assert caplog.records, "the agent logged nothing"
    assert password not in caplog.text
    assert all(password not in r.model_dump_json() for r in agent.reports(task))


def test_missing_credentials_fail_with_the_registry_401(
    agents: Agents, auth_registry: LocalRegistry, oci_image_factory: OciImageFactory, cri: CriImageClient
) -> None:
    image = oci_image_factory.push(auth_registry, "private/anonymous", "v1")
    agent = agents()
    task = agent.task(image.reference)

    agent.send(task)

    final = agent.final(task)
    with pytest.raises(ImagePullError) as direct:
        cri.pull_image(image.reference).result(timeout=30)
    assert final.phase == "Failed"
    assert final.message == direct.value.details
    assert REFUSED_WITHOUT_CREDENTIALS.search(final.message), final.message


def test_unreadable_pull_secret_is_named_in_the_failure(
    agents: Agents, auth_registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(auth_registry, "private/no-secret", "v1")
    missing = "arn:aws:secretsmanager:us-west-2:123456789012:secret:prewarm/pull-secrets/default/gone-AbCdEf"
    agent = agents()
    task = agent.task(image.reference, pull_secret_arns=[missing])

    agent.send(task)

    final = agent.final(task)
    assert final.phase == "Failed"
    assert REFUSED_WITHOUT_CREDENTIALS.search(final.message), final.message
    assert f"secret {missing} does not exist" in final.message


@pytest.fixture(scope="module")
def ecr_registry(tmp_path_factory: pytest.TempPathFactory, node_runtime: PrivateContainerd) -> Iterator[LocalRegistry]:
    """A registry serving the ECR host that only takes moto's ECR token for the account."""
    with LocalRegistry(tmp_path_factory.mktemp("ecr"), htpasswd_users={"AWS": f"{ECR_ACCOUNT}-auth-token"}) as served:
        node_runtime.add_registry_mirror(ECR_HOST, served.url)
        yield served
        served.remove_data()


def test_ecr_image_is_pulled_with_a_token_from_the_agents_own_role(
    agents: Agents, ecr_registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given an ECR host whose registry accepts only ecr:GetAuthorizationToken's answer
    pushed = oci_image_factory.push(ecr_registry, "team/api", "v1")
    agent = agents()
    task = agent.task(f"{ECR_HOST}/team/api:v1")

    # When a task for it arrives, with no pull secret
    agent.send(task)

    # Then the agent got a token from (moto's) ECR and the pull succeeded
    final = agent.final(task)
    assert final.phase == "Succeeded", final.message
    assert final.image_id == pushed.config_digest
    assert final.repo_digest == f"{ECR_HOST}/team/api@{pushed.manifest_digest}"
    # The layers came from the manifest read through the node's hosts.toml with the same token
    assert final.bytes_total == sum(pushed.layer_sizes)


COPY_ACCOUNT = "210987654321"
COPY_HOST = f"{COPY_ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com"
COPY_TOKEN = "token-from-the-refresher"


class RefusedRole:
    """An ECR client for a role without ecr:GetAuthorizationToken: every call answers botocore's
    AccessDeniedException, which `EcrTokenSource` turns into the agent's `RegistryTokenError`."""

    def __init__(self) -> None:
        self.calls = 0

    def get_authorization_token(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        raise ClientError(
            {"Error": {"Code": "AccessDeniedException",
                       "Message": "User: arn:aws:sts::210987654321:assumed-role/prewarm-agent/node is not "
                                  "authorized to perform: ecr:GetAuthorizationToken on resource: *"}},
            "GetAuthorizationToken",
        )


@pytest.fixture(scope="module")
def copy_registry(tmp_path_factory: pytest.TempPathFactory, node_runtime: PrivateContainerd) -> Iterator[LocalRegistry]:
    """A registry serving another ECR host that only takes the token the refresher stored."""
    with LocalRegistry(tmp_path_factory.mktemp("ecr-copy"), htpasswd_users={"AWS": COPY_TOKEN}) as served:
        node_runtime.add_registry_mirror(COPY_HOST, served.url)
        yield served
        served.remove_data()


def _store_copy(aws: MotoServer, expires_in: float) -> tuple[str, str]:
    """Writes the refresher's copy of COPY_HOST's token, as `refresh_ecr_credentials` does; returns
    (SECRET_PREFIX, secret name). The token is made here: moto's ECR answers a fixed token that expired
    in 2015, which the agent's expiry check would refuse."""
    prefix = f"prewarm/it-{uuid.uuid4().hex[:8]}"
    now = time.time()
    token = RegistryToken.for_hosts("AWS", COPY_TOKEN, [COPY_HOST], issued_at=min(now, now + expires_in - 1),
                                    expires_at=now + expires_in)
    SecretsManagerCredentialStore(prefix, client=aws.client("secretsmanager")).write(COPY_HOST, token)
    return prefix, registry_secret_name(prefix, COPY_HOST)


@pytest.mark.parametrize(("mode", "role_asked"), [("shared", False), ("role", True), ("copies", False)])
def test_an_agent_ecr_refuses_pulls_with_the_refreshers_copy(
    agents: Agents, aws: MotoServer, copy_registry: LocalRegistry, oci_image_factory: OciImageFactory,
    mode: str, role_asked: bool,
) -> None:
    # Given an agent whose role ECR refuses, and the refresher's copy of the registry's token
    pushed = oci_image_factory.push(copy_registry, "team/api", "v1")
    prefix, _ = _store_copy(aws, expires_in=12 * 3600)
    role = RefusedRole()
    agent = agents(SECRET_PREFIX=prefix, ECR_CREDENTIALS=mode,
                   collaborators={"ecr_tokens": EcrTokenSource(client_factory=lambda *_: role)})
    task = agent.task(f"{COPY_HOST}/team/api:v1", image_pull_policy="Always")

    # When a task for the registry arrives, with no pull secret
    agent.send(task)

    # Then the pull succeeds with the copy; the role is asked only with ECR_CREDENTIALS=role (shared, the
    # default, reads the copy first and asks the role only when there is no usable copy)
    final = agent.final(task)
    assert final.phase == "Succeeded", final.message
    assert final.repo_digest == f"{COPY_HOST}/team/api@{pushed.manifest_digest}"
    assert final.bytes_total == sum(pushed.layer_sizes)
    assert (role.calls > 0) is role_asked


def test_an_expired_copy_is_named_in_the_failure_with_the_roles_refusal(
    agents: Agents, aws: MotoServer, copy_registry: LocalRegistry, oci_image_factory: OciImageFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given an agent whose role ECR refuses, and a copy past its expiresAt
    oci_image_factory.push(copy_registry, "team/expired", "v1")
    prefix, name = _store_copy(aws, expires_in=-60)
    refused = EcrTokenSource(client_factory=lambda *_: RefusedRole())
    agent = agents(SECRET_PREFIX=prefix, collaborators={"ecr_tokens": refused})
    task = agent.task(f"{COPY_HOST}/team/expired:v1")

    # When a task for the registry arrives
    with caplog.at_level(logging.DEBUG):
        agent.send(task)
        final = agent.final(task)

    # Then the pull fails with the registry's 401, naming the refusal and the expired secret, never the token
    assert final.phase == "Failed"
    assert REFUSED_WITHOUT_CREDENTIALS.search(final.message), final.message
    assert "AccessDeniedException" in final.message
    assert f"secret {name} expired at" in final.message
    assert COPY_TOKEN not in final.message
    assert COPY_TOKEN not in caplog.text


# --- node protection ---------------------------------------------------------------------------------


def test_registry_outside_the_allowlist_is_refused_without_a_pull(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(registry, "agent/not-allowed", "v1")
    agent = agents(REGISTRY_ALLOWLIST="*.dkr.ecr.*.amazonaws.com, registry.example.com")
    task = agent.task(image.reference)

    agent.send(task)

    final = agent.final(task)
    assert final.phase == "Failed"
    assert final.message == f"registry {registry.host} is not in the agent's allowlist"
    assert agent.metric("prewarm_agent_pull_calls_total") == 0


def test_allowlist_glob_with_a_port_lets_the_registry_through(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(registry, "agent/allowed", "v1")
    agent = agents(REGISTRY_ALLOWLIST="registry.example.com,127.0.0.1:*")
    task = agent.task(image.reference)

    agent.send(task)

    assert agent.final(task).phase == "Succeeded"


def test_disk_guard_refuses_when_the_imagefs_is_above_the_threshold(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory, cri: CriImageClient
) -> None:
    # Given a threshold below any real disk's usage
    image = oci_image_factory.push(registry, "agent/disk-full", "v1")
    agent = agents(DISK_THRESHOLD_PERCENT="0.001")
    task = agent.task(image.reference, backoff_limit=3)

    # When a task arrives
    agent.send(task)
    final = agent.final(task)

    # Then it fails at once with the guard's reason, no retries, no pull
    assert final.phase == "Failed"
    assert final.message.startswith("disk guard: imagefs ")
    assert final.message.endswith("% used, threshold 0.001%")
    assert cri.image_status(image.reference) is None
    assert agent.metric("prewarm_agent_disk_guard_refusals_total") == 1
    assert agent.metric("prewarm_agent_pull_calls_total") == 0


def test_disk_guard_refuses_an_image_bigger_than_the_room_left(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(registry, "agent/too-big", "v1")
    agent = agents(DISK_THRESHOLD_PERCENT="99.9")
    task = agent.task(image.reference, size_bytes=10**18)

    agent.send(task)

    final = agent.final(task)
    assert final.phase == "Failed"
    assert "threshold 99.9%; the image needs 1000000000000000000 bytes" in final.message


# --- messages ----------------------------------------------------------------------------------------


def test_poison_messages_are_logged_and_left_for_the_dead_letter_queue(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an agent that receives a non-JSON body and a task missing its image
    caplog.set_level(logging.ERROR, logger="prewarm_agent")
    agent = agents()
    agent.send("this is not json")
    agent.send(json.dumps({"v": 1, "kind": "task", "job": "default/x", "job_uid": "u", "round": 0, "node": agent.node}))
    image = oci_image_factory.push(registry, "agent/after-poison", "v1")
    task = agent.task(image.reference)
    agent.send(task)

    # Then the loop goes on: the valid task still succeeds ...
    assert agent.final(task).phase == "Succeeded"
    assert eventually(lambda: agent.metric("prewarm_agent_messages_received_total", kind="poison") == 2, timeout=5)
    # ... the poison messages are neither deleted nor taken: they wait out their visibility timeout
    assert agent.queue_depth() == (0, 2)
    poison_logs = [r.getMessage() for r in caplog.records if "poison message" in r.getMessage()]
    assert len(poison_logs) == 2
    assert any("image: Field required" in line for line in poison_logs)


def test_finished_task_delivered_again_is_answered_with_the_same_outcome(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given a task that succeeded
    image = oci_image_factory.push(registry, "agent/redelivered", "v1")
    agent = agents()
    task = agent.task(image.reference)
    agent.send(task)
    first = agent.final(task)

    # When the same task arrives again (SQS delivers at least once)
    agent.send(task)

    # Then the same report is sent again, without another pull, and the message is deleted
    agent.wait_for(task, lambda rs: len([r for r in rs if r.phase == "Succeeded"]) == 2, timeout=10)
    again = [r for r in agent.reports(task) if r.phase == "Succeeded"]
    assert again[0] == again[1] == first
    assert agent.metric("prewarm_agent_pull_calls_total") == 1
    assert eventually(lambda: agent.queue_depth() == (0, 0), timeout=5)


def test_cancel_before_its_task_is_recorded_and_the_task_never_pulls(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given a cancel that overtakes its task (SQS keeps no order)
    image = oci_image_factory.push(registry, "agent/cancel-first", "v1")
    agent = agents()
    task = agent.task(image.reference)
    agent.cancel(task, reason="job deleted")
    agent.wait_for(task, lambda rs: any(r.phase == "Cancelled" for r in rs), timeout=10)

    # When the task arrives afterwards
    agent.send(task)

    # Then it is answered Cancelled again and never pulled
    agent.wait_for(task, lambda rs: len(rs) == 2, timeout=10)
    assert [(r.phase, r.message) for r in agent.reports(task)] == [("Cancelled", "job deleted")] * 2
    assert agent.metric("prewarm_agent_pull_calls_total") == 0
    assert eventually(lambda: agent.queue_depth() == (0, 0), timeout=5)


# --- start-up -------------------------------------------------------------------------------------


def test_the_node_queue_is_created_with_the_dead_letter_redrive_and_reused_after_a_restart(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given an agent whose node queue the control plane made, stopped
    first = agents()
    url = first.queue_url
    attributes = first.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    first.stop()

    # When an agent for the same node starts again
    image = oci_image_factory.push(registry, "agent/restart", "v1")
    second = agents(node=first.node)
    task = second.task(image.reference)
    second.send(task)

    # Then the queue is the same, redriving to the shared DLQ, and tasks on it still run
    assert second.queue_url == url
    redrive = json.loads(attributes["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == first.dlq_arn
    assert int(redrive["maxReceiveCount"]) == 5
    assert second.final(task).phase == "Succeeded"


def test_two_agents_share_a_process_without_sharing_work_or_metrics(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    # Given two agents (two simulated nodes) in this process
    image = oci_image_factory.push(registry, "agent/two-nodes", "v1")
    one, two = agents(), agents()
    tasks = [one.task(image.reference), two.task(image.reference)]

    # When each gets a task on its own queue
    one.send(tasks[0])
    two.send(tasks[1])

    # Then each reports as its own node, counts only its own pull, and serves its own port
    finals = [one.final(tasks[0]), two.final(tasks[1])]
    assert [f.node for f in finals] == [one.node, two.node]
    assert one.metric("prewarm_agent_pulls_total", outcome="Succeeded") == 1
    assert two.metric("prewarm_agent_pulls_total", outcome="Succeeded") == 1
    assert one.agent.http_port != two.agent.http_port


# --- hello, probes, metrics ----------------------------------------------------------------------


def test_hello_carries_the_nodes_labels_and_architecture_from_the_api_and_its_images(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory, cri: CriImageClient
) -> None:
    # Given a Node object (architecture deliberately not this machine's) and an image on the node
    image = oci_image_factory.push(registry, "agent/hello", "v1")
    cri.pull_image(image.reference).result(timeout=30)
    node = f"ip-10-1-{uuid.uuid4().hex[:6]}.ec2.internal"
    labels = {"kubernetes.io/arch": "arm64", "node.kubernetes.io/instance-type": "m7g.large", "team": "ml"}
    with KubeApiServer() as api:
        api.seed_objects([{
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels},
            "status": {"nodeInfo": {"architecture": "arm64", "operatingSystem": "linux"}},
        }])

        # When the agent starts with the API's endpoint and a token
        agent = agents(node=node, KUBE_API_ENDPOINT=api.url, KUBE_BEARER_TOKEN=api.token)

    # Then its hello has the Node's labels and architecture, its queue and the images present
    (hello,) = agent.hellos()
    assert hello.node == node
    assert hello.labels == labels
    assert (hello.architecture, hello.os) == ("arm64", "linux")
    assert hello.queue_url == agent.queue_url
    assert f"{registry.host}/agent/hello@{image.manifest_digest}" in hello.images
    assert hello.agent_version


def test_hello_falls_back_to_this_machine_when_the_api_is_unreachable(
    agents: Agents, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="prewarm_agent")

    agent = agents(KUBE_API_ENDPOINT="http://127.0.0.1:9", KUBE_BEARER_TOKEN="test-token")

    (hello,) = agent.hellos()
    assert (hello.architecture, hello.labels) == (host_architecture(), {})
    assert any("cannot read node" in r.getMessage() and "platform.machine()" in r.getMessage()
               for r in caplog.records)


def test_probes_and_metrics_answer_on_the_http_port(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory
) -> None:
    image = oci_image_factory.push(registry, "agent/metrics", "v1")
    agent = agents()
    task = agent.task(image.reference)
    agent.send(task)
    agent.final(task)

    assert _http_get(agent, "/healthz") == (200, "ok\n")
    assert _http_get(agent, "/readyz") == (200, "ok\n")
    status, metrics = _http_get(agent, "/metrics")
    assert status == 200
    assert 'prewarm_agent_pulls_total{outcome="Succeeded"} 1.0' in metrics
    assert 'prewarm_agent_pull_seconds_count{outcome="Succeeded"} 1.0' in metrics
    assert f"prewarm_agent_pulled_bytes_total {float(sum(image.layer_sizes))}" in metrics
    assert "prewarm_agent_pulls_in_flight 0.0" in metrics
    assert "prewarm_agent_disk_guard_refusals_total 0.0" in metrics


def test_readyz_fails_when_the_runtime_is_gone(agents: Agents, tmp_path: pytest.TempPathFactory) -> None:
    agent = agents(CRI_SOCKET=f"{tmp_path}/missing.sock")

    status, body = _http_get(agent, "/readyz")

    assert status == 503
    assert "missing.sock is unavailable" in body
    assert _http_get(agent, "/healthz")[0] == 200


def test_task_for_another_node_is_left_for_the_dead_letter_queue(agents: Agents) -> None:
    agent = agents()
    stray = PullTask(job="default/x", job_uid="u-1", round=0, node="some-other-node", image="busybox:1")

    agent.send(stray)

    assert eventually(lambda: agent.metric("prewarm_agent_messages_received_total", kind="poison") == 1, timeout=5)
    assert agent.queue_depth() == (0, 1)


# --- pinning -----------------------------------------------------------------------------------------


def test_a_pin_task_labels_every_record_of_the_image_pinned_and_nothing_else(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory, node_runtime: PrivateContainerd
) -> None:
    # Given a job annotated prewarm.dev/pin: "true" (its tasks carry pin) and one that is not
    pinned_image = oci_image_factory.push(registry, "agent/pinned", "v1")
    plain_image = oci_image_factory.push(registry, "agent/unpinned", "v1")
    agent = agents()
    pinned, plain = agent.task(pinned_image.reference, pin=True), agent.task(plain_image.reference)

    # When both are pulled
    agent.send(pinned)
    agent.send(plain)
    pinned_final, plain_final = agent.final(pinned), agent.final(plain)

    # Then every record containerd made for the pinned image (tag, repo@digest, config id) has the
    # label the CRI reads as pinned, the CRI's own label is untouched, and the report says so
    assert pinned_final.phase == "Succeeded" and pinned_final.message.endswith("pinned"), pinned_final.message
    with ImagePins(str(node_runtime.socket_path)) as pins:
        names = {record.name for record in pins.records(pinned_image.reference)}
        assert {pinned_image.reference, pinned_image.digest_reference, pinned_image.config_digest} <= names
        for name in names:
            labels = pins.labels(name)
            assert labels is not None and labels[PINNED_LABEL] == "pinned", (name, labels)
            assert labels.get("io.cri-containerd.image") == "managed", (name, labels)
        # ... the other image is not pinned
        assert plain_final.phase == "Succeeded" and "pinned" not in plain_final.message
        assert all(PINNED_LABEL not in (pins.labels(r.name) or {}) for r in pins.records(plain_image.reference))
        # ... unpinning removes the label alone, and a missing image is an error naming it
        pins.unpin(pinned_image.reference)
        assert PINNED_LABEL not in (pins.labels(pinned_image.reference) or {})
        assert (pins.labels(pinned_image.reference) or {}).get("io.cri-containerd.image") == "managed"
        with pytest.raises(ImageNotFoundError, match=r"cannot pin registry\.invalid/none:v1: containerd holds no"):
            pins.pin("registry.invalid/none:v1")


@pytest.mark.skipif(bool(missing_tools()), reason=missing_tools() or "ok")
def test_a_pinned_image_survives_kubelets_image_garbage_collection_and_an_unpinned_one_is_removed(
    agents: Agents, registry: LocalRegistry, oci_image_factory: OciImageFactory, cri: CriImageClient,
    node_runtime: PrivateContainerd, tmp_path: Path,
) -> None:
    # Given two images an agent pulled, one for a pinned job, and a third that a running container uses
    pinned_image = oci_image_factory.push(registry, "agent/gc-pinned", "v1", size_mb=1)
    plain_image = oci_image_factory.push(registry, "agent/gc-plain", "v1", size_mb=1)
    pusher = RegistryPusher(registry.url, registry.auth)
    used_image = pusher.push_image("agent/gc-used", "v1", runnable_image())
    agent = agents()
    pinned, plain = agent.task(pinned_image.reference, pin=True), agent.task(plain_image.reference)
    used = agent.task(used_image.reference)
    for task in (pinned, plain, used):
        agent.send(task)
    assert agent.final(pinned).phase == agent.final(plain).phase == agent.final(used).phase == "Succeeded"
    runtime = ContainerRuntime.parse(f"containerd://{cri.version().runtime_version}")
    install_sandbox_image(node_runtime, pusher, registry.host, registry.auth)
    pods = CriPods(node_runtime.socket_path, tmp_path)
    try:
        pods.run(used_image.reference)
        ours = {pinned_image.config_digest, plain_image.config_digest}

        # When kubelet's image garbage collection runs with the disk far past its threshold (over these three:
        # the module's other images belong to other tests)
        collected = collect_images(cri, candidates={*ours, used_image.config_digest})
    finally:
        pods.close()

    # Then the image the container uses stays: CRI ListContainers shows it, as the kubelet reads it
    assert [image.id for image in collected.kept_in_use] == [used_image.config_digest]
    assert cri.image_status(used_image.reference) is not None
    # ... the unpinned image is removed, its bytes freed
    assert [image.id for image in collected.removed if image.id == plain_image.config_digest]
    assert cri.image_status(plain_image.reference) is None
    assert collected.freed_bytes >= 1024 * 1024
    if runtime.pins:
        # ... and the pinned one stays, as the CRI reports it pinned (containerd 1.7.10 and later)
        assert [image.id for image in collected.kept_pinned] == [pinned_image.config_digest]
        kept = cri.image_status(pinned_image.reference)
        assert kept is not None and kept.pinned
    else:
        # ... while containerd 1.6 keeps the label but never reports the image pinned: it goes too
        assert {image.id for image in collected.removed} == ours and not collected.kept_pinned
        assert cri.image_status(pinned_image.reference) is None

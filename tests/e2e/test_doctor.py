"""`prewarm --local doctor` against one real local stack: all ok when fresh; then each check made to
fail by one real fault, its problem line asserted, and the fault undone (mostly by the fix the line
names) before the next.

The stack is local mode as `prewarm local up` runs it (moto behind the AWS limits layer, the embedded
API with the RBAC `prewarm install` applies and local mode playing the agent DaemonSet's controller
and kubelets, a containerd per node), with its agents in this process. The CLI runs as its own
process, as the operator. Faults go in where the doctor's inputs live: the state file (the stack's
outputs and access entries, as CloudFormation and EKS hold them), the cluster, the queues, Secrets
Manager and the job table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prewarm.adapters.dynamodb import DynamoJobStore
from prewarm.adapters.sqs import NodeQueues
from prewarm.domain.kubernetes import format_time
from prewarm.domain.refresh import registry_secret_name
from prewarm.domain.runtimes import ContainerRuntime
from prewarm.domain.schedules import DAILY_ROUND, SWEEP, ScheduleRun
from prewarm_cli.targets import STATE_ENV, read_local_state
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.localmode import LocalMode, missing_prerequisites

pytestmark = [pytest.mark.integration, pytest.mark.node,
              pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites()) or "ok")]

PREWARM = str(Path(sys.executable).with_name("prewarm"))
CHECKS = ("stack outputs", "cluster access", "function RBAC", "agent DaemonSet", "container runtimes",
          "registry mirrors", "agent versions", "node queues", "node queue policies", "registered clusters",
          "replication events", "dead-letter queues", "credentials", "registry pulls", "image credentials",
          "warm snapshots", "sweep", "daily round")
RESTART = "restart the local stack (`prewarm local down`, then `prewarm local up`)"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMode]:
    patch = pytest.MonkeyPatch()
    patch.setenv(STATE_ENV, str(tmp_path_factory.mktemp("doctor") / "local.json"))
    try:
        with LocalMode(nodes=2) as mode:
            yield mode
    finally:
        patch.undo()


def prewarm(*args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({STATE_ENV: str(state)} if state else {})}
    return subprocess.run([PREWARM, *args], capture_output=True, text=True, env=env, timeout=120, check=False)


def doctor(state: Path | None = None) -> tuple[int, dict[str, str]]:
    """The exit code and each check's line, by check name."""
    done = prewarm("--local", "doctor", state=state)
    lines = done.stdout.splitlines()
    by_name = {name: line for name in CHECKS for line in lines if line[6:].split(":")[0] == name}
    assert list(by_name) == list(CHECKS), done.stdout + done.stderr
    return done.returncode, by_name


def failing(lines: dict[str, str]) -> list[str]:
    return [name for name, line in lines.items() if not line.startswith("ok ")]


def state_copy(tmp_path: Path, change: Any) -> Path:
    """A copy of the stack's state file with `change(env)` applied to its settings."""
    doc = json.loads(Path(os.environ[STATE_ENV]).read_text())
    change(doc["env"])
    copy = tmp_path / "changed.json"
    copy.write_text(json.dumps(doc))
    return copy


def env_of(local: LocalMode) -> dict[str, str]:
    return dict(read_local_state().env)


def aws(local: LocalMode, service: str) -> Any:
    assert local.aws is not None
    return local.aws.client(service)


def store(local: LocalMode) -> DynamoJobStore:
    return DynamoJobStore(env_of(local)["TABLE_NAME"], client=aws(local, "dynamodb"))


def test_a_fresh_stack_is_all_ok(local: LocalMode) -> None:
    # Given a stack just up: every agent consumes its node queue, as an agent process is waited for as it starts
    assert all(node.agent.consuming() for node in local.nodes.values())

    code, lines = doctor()

    assert code == 0 and failing(lines) == [], "\n".join(lines.values())
    assert lines["stack outputs"] == "ok    stack outputs"
    assert lines["agent DaemonSet"] == "ok    agent DaemonSet: ready on 2 of 2 nodes"
    assert lines["node queues"] == "ok    node queues: 2 queues, one per node with an agent"
    assert lines["dead-letter queues"] == "ok    dead-letter queues: 5 empty"
    assert lines["registered clusters"] == "ok    registered clusters: none: the stack serves its own cluster only"
    # The local nodes' containerd has the registry that plays ECR as a server in hosts.toml, not a mirror.
    assert lines["registry mirrors"] == ("ok    registry mirrors: no node-local registry mirror in containerd's "
                                         "hosts.toml on 2 nodes: every node pulls from the registry")
    assert lines["credentials"].startswith("ok    credentials: earliest expiry in 11h (")
    assert lines["daily round"].startswith("ok    daily round: not due yet (the stack is ")


def test_each_nodes_containerd_is_reported_and_one_that_cannot_pin_is_warned_of(local: LocalMode) -> None:
    # Given the local nodes' containerd (2.1 unless PREWARM_CONTAINERD says otherwise), as their kubelets report it
    assert local.kube is not None
    first, second = sorted(local.nodes)
    with local.nodes[first].containerd.cri_client() as cri:
        running = ContainerRuntime.parse(f"containerd://{cri.version().runtime_version}")
    line = doctor()[1]["container runtimes"]
    mark = "ok    " if running.pins else "warn  "
    assert line.startswith(f"{mark}container runtimes: containerd {running.version} on 2 nodes"), line
    # When one node's kubelet reports containerd 1.6.20, which cannot pin
    node = local.kube.get_object("nodes", second)
    assert node is not None
    reported = node["status"]["nodeInfo"]["containerRuntimeVersion"]
    node["status"]["nodeInfo"]["containerRuntimeVersion"] = "containerd://1.6.20~ds1"
    local.kube.seed_objects([node])
    try:
        code, lines = doctor()
        # Then the doctor warns, naming the node and its version, and exits 0
        assert code == 0 and lines["container runtimes"].startswith("warn  container runtimes: ")
        assert f"pinning cannot work on 1: {second} (containerd 1.6.20): pinned jobs' images may be removed" \
            in lines["container runtimes"]
        assert "containerd 1.6.20 on 1 node" in lines["container runtimes"]
    finally:
        node["status"]["nodeInfo"]["containerRuntimeVersion"] = reported
        local.kube.seed_objects([node])


def test_a_missing_output_is_named_and_what_depends_on_it_is_skipped(local: LocalMode, tmp_path: Path) -> None:
    state = state_copy(tmp_path, lambda env: env.pop("DEAD_LETTER_QUEUE_URLS"))

    code, lines = doctor(state)

    assert code == 1 and failing(lines) == ["stack outputs", "dead-letter queues"]
    assert lines["stack outputs"] == f"FAIL  stack outputs: missing DeadLetterQueueUrls: {RESTART}"
    assert lines["dead-letter queues"] == "skip  dead-letter queues: the stack names none (DeadLetterQueueUrls)"


def test_an_unreachable_api_fails_cluster_access_and_skips_what_needs_the_cluster(
        local: LocalMode, tmp_path: Path) -> None:
    state = state_copy(tmp_path, lambda env: env.update(KUBE_API_ENDPOINT="http://127.0.0.1:9"))

    code, lines = doctor(state)

    assert code == 1
    assert failing(lines) == ["cluster access", "function RBAC", "agent DaemonSet", "container runtimes",
                              "node queues", "image credentials"]
    assert lines["cluster access"].startswith(
        "FAIL  cluster access: the Kubernetes API at http://127.0.0.1:9 did not answer: ")
    assert lines["cluster access"].endswith(": is the local stack running? (`prewarm local status`)")
    assert lines["function RBAC"] == \
        "skip  function RBAC: the Kubernetes API did not answer (cluster access)"
    assert lines["node queues"] == "skip  node queues: the cluster's nodes are unknown (cluster access)"


def test_a_function_without_its_access_entry_is_named(local: LocalMode, tmp_path: Path) -> None:
    sweep_role = env_of(local)["SWEEP_ROLE_ARN"]

    def drop_sweep(env: dict[str, str]) -> None:
        entries = json.loads(env["LOCAL_ACCESS_ENTRIES"])
        del entries[sweep_role]
        env["LOCAL_ACCESS_ENTRIES"] = json.dumps(entries)

    code, lines = doctor(state_copy(tmp_path, drop_sweep))

    assert code == 1 and failing(lines) == ["cluster access"]
    assert lines["cluster access"] == (f"FAIL  cluster access: sweep ({sweep_role}) has no access entry: {RESTART}: "
                                       "it creates the entries")


def test_a_deleted_cluster_role_binding_denies_each_verb_of_the_functions_that_need_it(local: LocalMode) -> None:
    assert local.kube is not None
    assert local.kube.remove_object("clusterrolebindings", "prewarm-control-plane")
    try:
        code, lines = doctor()

        assert code == 1 and failing(lines) == ["function RBAC"]
        assert lines["function RBAC"] == (
            "FAIL  function RBAC: dispatch_job cannot get nodes, list nodes, list pods in default; "
            "record_status cannot get nodes, list pods in default; sweep cannot get nodes, list nodes: "
            "run `prewarm install` (it binds the functions' groups); check with `kubectl auth can-i get nodes "
            "--as prewarm --as-group prewarm-control-plane --as-group prewarm-pull-secrets`")
    finally:
        # The fix the line names
        installed = prewarm("--local", "install")
        assert installed.returncode == 0, installed.stderr
    assert "clusterrolebinding.rbac.authorization.k8s.io/prewarm-control-plane created" in installed.stdout
    assert doctor()[1]["function RBAC"].startswith("ok    function RBAC: ")


def test_a_stopped_agent_is_not_ready_on_its_node(local: LocalMode) -> None:
    assert local.kube is not None
    node = sorted(local.nodes)[0]
    assert prewarm("--local", "local", "agent", "stop", node).returncode == 0
    try:
        (pod,) = [p["metadata"]["name"] for p in local.kube.list_objects("pods", "prewarm-system")
                  if p["spec"]["nodeName"] == node]

        code, lines = doctor()

        assert code == 1 and failing(lines) == ["agent DaemonSet"]
        assert lines["agent DaemonSet"] == (
            f"FAIL  agent DaemonSet: not ready on 1 of 2 nodes: {node} (pod {pod} not Ready: terminated "
            f"(Completed, exit 0)): see `kubectl -n prewarm-system describe pod {pod}` and its logs; until it is "
            "ready, jobs fail that node with `no agent on node`")
    finally:
        assert prewarm("--local", "local", "agent", "start", node).returncode == 0
    assert doctor()[1]["agent DaemonSet"] == "ok    agent DaemonSet: ready on 2 of 2 nodes"


def test_a_queue_of_a_departed_node_is_found_and_the_sweep_removes_it(local: LocalMode) -> None:
    env = env_of(local)
    # The queue a node had before it left the cluster: as the control plane made it on the node's hello
    url = NodeQueues(env["NODE_QUEUE_PREFIX"], env["STATUS_QUEUE_URL"], client=aws(local, "sqs"),
                     sender_arns=env["NODE_QUEUE_SENDER_ARNS"].split(",")).ensure_queue("gone-node")
    name = url.rsplit("/", 1)[1]

    code, lines = doctor()

    assert code == 1 and failing(lines) == ["node queues"]
    assert lines["node queues"] == (
        f"FAIL  node queues: 1 queue of departed nodes ({name}): run the sweep (`prewarm local fire sweep`), "
        f"which deletes them, or delete them (`aws sqs delete-queue --queue-url {url}`)")
    assert prewarm("--local", "local", "fire", "sweep").returncode == 0
    assert doctor()[1]["node queues"] == "ok    node queues: 2 queues, one per node with an agent"


def test_a_message_in_a_dead_letter_queue_is_counted(local: LocalMode) -> None:
    sqs = aws(local, "sqs")
    url = env_of(local)["DEAD_LETTER_QUEUE_URLS"].split(",")[0]
    sqs.send_message(QueueUrl=url, MessageBody='{"v": 1, "kind": "status", "phase": "Exploded"}')
    try:
        code, lines = doctor()

        assert code == 1 and failing(lines) == ["dead-letter queues"]
        assert lines["dead-letter queues"] == (
            f"FAIL  dead-letter queues: {url.rsplit('/', 1)[1]} holds 1 message: read them (`aws sqs receive-message "
            f"--queue-url {url}`), fix the cause, then redrive or purge (docs/operations.md, Dead-letter queues)")
    finally:
        sqs.purge_queue(QueueUrl=url)
    assert doctor()[1]["dead-letter queues"] == "ok    dead-letter queues: 5 empty"


def test_credentials_about_to_expire_are_named_and_a_refresh_renews_them(local: LocalMode) -> None:
    secrets = aws(local, "secretsmanager")
    secret_id = registry_secret_name(env_of(local)["SECRET_PREFIX"], ecr_host())
    # The agents' copy as a refresher that stopped 11.5 hours ago left it: 30 minutes to live
    document = json.loads(secrets.get_secret_value(SecretId=secret_id)["SecretString"])
    now = time.time()
    document.update(issuedAt=format_time(now - 11.5 * 3600), expiresAt=format_time(now + 1830))
    secrets.put_secret_value(SecretId=secret_id, SecretString=json.dumps(document))

    code, lines = doctor()

    assert code == 1 and failing(lines) == ["credentials"]
    assert lines["credentials"] == (
        f"FAIL  credentials: the agents' copy for {ecr_host()} expires in 30m: refresh_ecr_credentials is not "
        "renewing them (it does at half their life): see its logs and the ScheduleDLQ, then run it "
        "(`prewarm local fire refresh`)")
    assert prewarm("--local", "local", "fire", "refresh").returncode == 0
    assert doctor()[1]["credentials"].startswith("ok    credentials: earliest expiry in 11h (")


def test_a_sweep_whose_schedule_stopped_firing_is_overdue(local: LocalMode) -> None:
    assert local.stack is not None
    # The sweep's schedule disabled, its last run ten minutes ago
    local.stack.stop()
    local.stack.start(schedules=False)
    now = time.time()
    store(local).record_run(ScheduleRun(SWEEP, started_at=now - 601, finished_at=now - 600))
    try:
        code, lines = doctor()

        assert code == 1 and failing(lines) == ["sweep"]
        assert lines["sweep"] == (
            "FAIL  sweep: last ran 10m ago; it runs every 60s: check its logs and the ScheduleDLQ, and that its "
            "schedule is enabled; then run it (`prewarm local fire sweep`)")
        assert prewarm("--local", "local", "fire", "sweep").returncode == 0
        assert doctor()[1]["sweep"].startswith("ok    sweep: last ran ")
    finally:
        local.stack.stop()
        local.stack.start()


def test_a_daily_round_that_did_not_run_for_a_day_is_overdue(local: LocalMode) -> None:
    now = time.time()
    store(local).record_run(ScheduleRun(DAILY_ROUND, started_at=now - 28 * 3600 - 5, finished_at=now - 28 * 3600))

    code, lines = doctor()

    assert code == 1 and failing(lines) == ["daily round"]
    assert lines["daily round"] == (
        "FAIL  daily round: last ran 28h ago; it runs every 24h: check its logs and the ScheduleDLQ, and that its "
        "schedule is enabled; then run it (`prewarm local fire repull`)")
    assert prewarm("--local", "local", "fire", "repull").returncode == 0
    code, lines = doctor()
    assert code == 0 and lines["daily round"].startswith("ok    daily round: last ran "), "\n".join(lines.values())


def test_a_private_image_warmed_with_shared_credentials_is_a_warning_until_the_kubelets_verify(
        local: LocalMode) -> None:
    from prewarm.services.jobs import apply_manifest, delete_job

    # Given a job warming a private ECR image with the agents' shared credentials, on nodes whose kubelets
    # (1.33, as the embedded API) do not verify images already present
    jobs = store(local)
    apply_manifest(jobs, {"apiVersion": "prewarm.dev/v1alpha1", "kind": "ImagePullJob",
                          "metadata": {"name": "shared-warm", "namespace": "default"},
                          "spec": {"image": f"{ecr_host()}/team/app:v1", "parallelism": 0}}, now=time.time())
    nodes = sorted(local.nodes)
    try:
        code, lines = doctor()
        # Then the doctor warns, naming the job, the nodes and their policy, and still exits 0
        assert code == 0, "\n".join(lines.values())
        assert lines["image credentials"].startswith(
            "warn  image credentials: job default/shared-warm warms private ECR images with shared credentials: any "
            f"pod of 2 of 2 nodes may use them without credentials of its own (not enforced (kubelet before 1.35, or "
            f"feature gate KubeletEnsureSecretPulledImages off) on {nodes[0]}, {nodes[1]}); read from 2 node(s), one "
            "per pool of 2: set the kubelets' imagePullCredentialsVerificationPolicy to AlwaysVerify")
        # When the kubelets verify every image, it is ok
        assert local.kube is not None
        for node in nodes:
            local.kube.set_image_credentials_policy(node, "AlwaysVerify")
        code, lines = doctor()
        assert lines["image credentials"] == (
            "ok    image credentials: job default/shared-warm warms private ECR images with shared credentials, and "
            "every node's kubelet verifies them (AlwaysVerify on 2; read from 2 node(s), one per pool of 2)")
    finally:
        for node in nodes:
            assert local.kube is not None
            local.kube.set_image_credentials_policy(node, None)
        delete_job(jobs, NodeQueues(env_of(local)["NODE_QUEUE_PREFIX"], env_of(local)["STATUS_QUEUE_URL"],
                                    client=aws(local, "sqs")), "default", "shared-warm")

"""What the node agent adds to a pull: the same image pulled directly through the CRI and through the agent.

Real containerd (private, with its CRI plugin) and a real registry on 127.0.0.1 (as root); SQS is
moto's ThreadedMotoServer in its own process. The image (`--image-mb` of random bytes in one gzip
layer) is pulled three ways, each `--repeat` times, the ways taking turns to go first:

- direct: CRI `PullImage` on a warm gRPC channel, call to response;
- agent: a `PullTask` sent to the agent's node queue (it long-polls, as deployed), to the moment its
  Succeeded report is on the status queue (the agent's `SendMessage` returned), progress effectively
  off (`PROGRESS_INTERVAL_SECONDS=86400`);
- agent with progress: the same with a Pulling report every second (`PROGRESS_INTERVAL_SECONDS=1`).

Every pull starts from nothing: after each one the image is removed through the CRI (`RemoveImage`)
and the benchmark waits until containerd's content store no longer holds any of the image's blobs on
disk, no download is in progress and no snapshot is left, so nothing is reused; then `sync`, so the
last pull's writes reach the disk before the next pull starts instead of during it. The agents run in
this process, as one would on its node; their clients are observed (the CRI pull's start and end, the
task's receipt, each report's send), never changed, to say where the agent's time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import BenchmarkError, Target, emit, load_average, median, print_machine, print_targets

QUEUE_PREFIX = "bench-agent"
JOB = "bench/agent-overhead"
FINAL_PHASES = ("Succeeded", "Failed", "Cancelled")
PROGRESS_OFF_SECONDS = 86400.0
PROGRESS_ON_SECONDS = 1.0
FRESH_TIMEOUT = 60.0
TARGET_FACTOR = 1.05
TARGET_SLACK_S = 0.05
WAYS = ("direct", "agent", "agent_progress")
WAY_NAMES = {
    "direct": "direct CRI PullImage",
    "agent": "agent, progress off",
    "agent_progress": f"agent, progress every {PROGRESS_ON_SECONDS:g} s",
}
# Each way goes first, second and third once in three rounds; the next three rounds reverse who
# follows whom, so that no way always runs right after the same other one (a Williams design).
ORDERS = tuple(ways[k:] + ways[:k] for ways in (WAYS, WAYS[::-1]) for k in range(len(WAYS)))
STEPS = (
    # The agent's long poll can return before the sender's SendMessage call has: one step, not two.
    ("delivery", "task SendMessage to the agent's long poll returning it"),
    ("before_pull", "agent: message to PullImage (parse, thread, ImageStatus, disk, credentials)"),
    ("pull", "PullImage inside the agent"),
    ("after_pull", "agent: PullImage done to Succeeded report built (wake-up, ImageStatus, layers)"),
    ("report_send", "Succeeded SendMessage"),
)


def missing_node_tools() -> list[str]:
    """What a benchmark on real containerd and a real registry needs and this machine lacks."""
    from prewarm_devtools.localmode import missing_prerequisites

    problems: list[str] = missing_prerequisites()
    return problems


def require_node_tools(benchmark: str) -> None:
    """Exit with status 2, naming what is missing, unless containerd and the registry can run here."""
    missing = missing_node_tools()
    if missing:
        print(f"{benchmark} pulls with real containerd and a real registry, and cannot run here; missing:",
              file=sys.stderr)
        for problem in missing:
            print(f"  - {problem}", file=sys.stderr)
        print("`make node-deps` as root installs containerd and docker-registry.", file=sys.stderr)
        sys.exit(2)


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A short directory under /tmp (containerd's socket paths must stay short), removed at the end."""
    from prewarm_devtools.node.containerd import unmount_all_under

    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        unmount_all_under(path)
        shutil.rmtree(path, ignore_errors=True)


# --- a fresh start between pulls ---------------------------------------------------------------


def image_left(containerd: Any, digests: Sequence[str]) -> list[str]:
    """What containerd still holds of an image: its blobs on disk, downloads in progress, snapshots.

    On disk, not in containerd's metadata: a blob whose file is still there is not downloaded again.
    """
    blobs = containerd.root_dir / "io.containerd.content.v1.content" / "blobs"
    left = [f"blob {digest}" for digest in digests if (blobs / digest.replace(":", "/", 1)).exists()]
    left += [f"download {ingest.ref}" for ingest in containerd.stats_ingest()]
    snapshots = containerd.root_dir / f"io.containerd.snapshotter.v1.{containerd.snapshotter}" / "snapshots"
    if snapshots.is_dir():
        left += [f"snapshot {path.name}" for path in snapshots.iterdir()]
    return left


def make_fresh(containerd: Any, cri: Any, reference: str, digests: Sequence[str]) -> float:
    """Remove the image through the CRI and wait until none of it is left; returns the seconds waited."""
    blobs = containerd.root_dir / "io.containerd.content.v1.content" / "blobs"
    if not all((blobs / d.replace(":", "/", 1)).exists() for d in digests):
        # Otherwise the check below would pass for the wrong reason: the store is not where we look.
        raise BenchmarkError(f"the pulled image's blobs are not under {blobs}: cannot check that they go")
    cri.remove_image(reference)
    started = time.perf_counter()
    while left := image_left(containerd, digests):
        if time.perf_counter() - started > FRESH_TIMEOUT:
            raise BenchmarkError(f"{FRESH_TIMEOUT:g} s after RemoveImage containerd still holds: {', '.join(left)}")
        time.sleep(0.05)
    if cri.image_status(reference) is not None:
        raise BenchmarkError(f"{reference} is still present after RemoveImage")
    waited = time.perf_counter() - started
    # The last pull's writes (blob and unpacked layer) go to disk now, not during the next pull.
    os.sync()
    return waited


def direct_pull(cri: Any, reference: str, auth: tuple[str, str] | None = None) -> float:
    """Seconds of one CRI PullImage, call to response."""
    started = time.perf_counter()
    cri.pull_image(reference, auth=auth).result()
    return time.perf_counter() - started


# --- observing an agent ------------------------------------------------------------------------


class TimedCri:
    """The agent's CRI client, unchanged, except that each PullImage call's [start, end] goes to `pulls`."""

    def __init__(self, client: Any, pulls: list[list[float]]) -> None:
        self._client = client
        self.pulls = pulls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def pull_image(self, image: str, auth: tuple[str, str] | None = None,
                   sandbox_labels: Mapping[str, str] | None = None,
                   sandbox_annotations: Mapping[str, str] | None = None, timeout: float | None = None) -> Any:
        times = [time.perf_counter()]
        handle = self._client.pull_image(image, auth, sandbox_labels, sandbox_annotations, timeout)
        self.pulls.append(times)
        # Called from a gRPC thread as the response arrives.
        handle.add_done_callback(lambda _handle: times.append(time.perf_counter()))
        return handle


@dataclass
class Sent:
    phase: str
    started: float
    done: float


@dataclass
class AgentProbe:
    """Sees what one agent does: the receipt of each task, its PullImage calls, each report it sends."""

    status: Any  # the agent's StatusQueue, wrapped: the agent sends through `send`
    received: dict[str, float] = field(default_factory=dict)
    pulls: list[list[float]] = field(default_factory=list)
    sent: dict[str, list[Sent]] = field(default_factory=dict)
    finals: dict[str, threading.Event] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, message: Any) -> None:
        started = time.perf_counter()
        self.status.send(message)
        done = time.perf_counter()
        job_uid = getattr(message, "job_uid", None)
        if job_uid is None:  # the hello
            return
        with self._lock:
            self.sent.setdefault(job_uid, []).append(Sent(message.phase, started, done))
            final = self.finals.get(job_uid)
        if final is not None and message.phase in FINAL_PHASES:
            final.set()

    def on_receive(self, parsed: Mapping[str, Any] | None = None, **_: Any) -> None:
        """botocore `after-call.sqs.ReceiveMessage` hook on the agent's SQS client."""
        now = time.perf_counter()
        for message in (parsed or {}).get("Messages") or ():
            job_uid = json.loads(message.get("Body") or "{}").get("job_uid")
            if job_uid:
                with self._lock:
                    self.received.setdefault(job_uid, now)

    def expect(self, job_uid: str) -> threading.Event:
        with self._lock:
            return self.finals.setdefault(job_uid, threading.Event())


@dataclass
class NodeAgent:
    node: str
    agent: Any
    probe: AgentProbe
    cri: Any
    queue_url: str
    status_url: str

    def stop(self) -> None:
        try:
            self.agent.stop(2.0)
        finally:
            self.cri.close()


def start_agent(node: str, moto_url: str, containerd: Any, dlq_arn: str, *, progress_seconds: float,
                receive_wait: int) -> NodeAgent:
    """One agent for `node` on `containerd`, its own status queue, its clients observed by a probe."""
    from prewarm.adapters.sqs import NodeQueues, StatusQueue
    from prewarm_agent.agent import Agent, aws_client
    from prewarm_agent.cri.client import CriImageClient
    from prewarm_agent.node import NodeFacts, local_architecture
    from prewarm_agent.settings import AgentSettings
    from prewarm_devtools.sam.aws import REGION

    sqs = moto_client(moto_url, "sqs")
    status_url = sqs.create_queue(QueueName=f"bench-status-{node}")["QueueUrl"]
    settings = AgentSettings.from_env({
        "NODE_NAME": node, "NODE_QUEUE_PREFIX": QUEUE_PREFIX, "STATUS_QUEUE_URL": status_url,
        "NODE_DLQ_ARN": dlq_arn, "AWS_REGION": REGION, "AWS_ENDPOINT_URL": moto_url,
        "CRI_SOCKET": str(containerd.socket_path), "REGISTRY_CONFIG_PATH": str(containerd.certs_dir),
        "RECEIVE_WAIT_SECONDS": str(receive_wait), "PROGRESS_INTERVAL_SECONDS": str(progress_seconds),
        "HTTP_BIND_ADDRESS": "127.0.0.1", "HTTP_PORT": "0", "LOG_LEVEL": "WARNING",
    })
    agent_sqs = aws_client("sqs", settings, pool=2 * settings.max_concurrent_pulls + 8)
    probe = AgentProbe(StatusQueue(status_url, client=agent_sqs))
    agent_sqs.meta.events.register("after-call.sqs.ReceiveMessage", probe.on_receive)
    cri = TimedCri(CriImageClient(str(containerd.socket_path)), probe.pulls)
    agent = Agent(settings, cri=cri, sqs=agent_sqs, status=probe,
                  node=lambda: NodeFacts(name=node, architecture=local_architecture()))
    # The control plane makes a node's queue on its verified hello; here, before the agent waits for it.
    queue_url = NodeQueues(QUEUE_PREFIX, status_url, dlq_arn=dlq_arn, client=sqs).ensure_queue(node)
    agent.start()
    return NodeAgent(node, agent, probe, cri, queue_url, status_url)


def agent_pull(sqs: Any, node: NodeAgent, reference: str, timeout: float) -> dict[str, float]:
    """One task through the agent: total seconds (task sent to Succeeded on the status queue) and its steps."""
    from prewarm.domain.messages import PullTask

    task = PullTask(job=JOB, job_uid=uuid.uuid4().hex, round=0, node=node.node, image=reference,
                    timeout_seconds=int(timeout), backoff_limit=0)
    final = node.probe.expect(task.job_uid)
    pulls_before = len(node.probe.pulls)
    sent = time.perf_counter()
    sqs.send_message(QueueUrl=node.queue_url, MessageBody=task.model_dump_json())
    if not final.wait(timeout):
        raise BenchmarkError(f"the agent on {node.node} sent no final report within {timeout:g} s")
    reports = node.probe.sent[task.job_uid]
    last = reports[-1]
    if last.phase != "Succeeded":
        raise BenchmarkError(f"the agent's pull ended {last.phase}; see its log above")
    confirm_on_status_queue(sqs, node.status_url, task.job_uid)
    if len(node.probe.pulls) != pulls_before + 1:
        raise BenchmarkError(f"expected one PullImage call by the agent, saw {len(node.probe.pulls) - pulls_before}")
    pull_start, pull_end = node.probe.pulls[-1]
    received = node.probe.received[task.job_uid]
    pulling = reports[:-1]
    return {
        "total": last.done - sent,
        "delivery": received - sent,
        "before_pull": pull_start - received,
        "pull": pull_end - pull_start,
        "after_pull": last.started - pull_end,
        "report_send": last.done - last.started,
        "pulling_reports": len(pulling),
        "pulling_send": sum(r.done - r.started for r in pulling),
    }


def confirm_on_status_queue(sqs: Any, status_url: str, job_uid: str) -> None:
    """Read the status queue until the job's Succeeded report is there (emptying the queue as it goes)."""
    from prewarm.domain.messages import StatusReport, parse_agent_message

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = sqs.receive_message(QueueUrl=status_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        found = False
        for message in answer.get("Messages") or ():
            report = parse_agent_message(message["Body"])
            sqs.delete_message(QueueUrl=status_url, ReceiptHandle=message["ReceiptHandle"])
            found = found or (isinstance(report, StatusReport) and report.job_uid == job_uid
                              and report.phase == "Succeeded")
        if found:
            return
    raise BenchmarkError(f"the agent said it sent Succeeded for {job_uid}, but the status queue does not have it")


# --- the benchmark -----------------------------------------------------------------------------


def benchmark(image_mb: float, repeat: int, warmup: int, receive_wait: int) -> dict[str, Any]:
    from benchmarks.servers import MotoProcess
    from prewarm_devtools.node.containerd import PrivateContainerd
    from prewarm_devtools.node.images import RegistryPusher, build_image
    from prewarm_devtools.node.registry import LocalRegistry
    from prewarm_devtools.sam.aws import aws_environment

    print_machine()
    with ExitStack() as stack:
        base = stack.enter_context(scratch_dir("pw-ao-"))
        moto = stack.enter_context(MotoProcess())
        stack.enter_context(aws_environment(moto.url))
        registry = stack.enter_context(LocalRegistry(base / "registry"))
        containerd = PrivateContainerd(base / "c")
        containerd.add_registry_mirror(registry.host, registry.url)
        stack.enter_context(containerd)
        cri = stack.enter_context(containerd.cri_client(timeout=60))
        version = cri.version()

        built = time.perf_counter()
        image = build_image(size_mb=image_mb)
        pushed = RegistryPusher(registry.url).push_image("bench/agent-overhead", "v1", image)
        del image
        reference = pushed.digest_reference
        digests = [*pushed.layer_digests, pushed.config_digest, pushed.manifest_digest]
        print(f"agent_overhead: a {image_mb:g} MB image ({pushed.total_size:,} bytes, one gzip layer) built and "
              f"pushed to a local registry in {time.perf_counter() - built:.1f} s; {version.runtime_name} "
              f"{version.runtime_version} ({containerd.snapshotter} snapshotter)")

        sqs = moto_client(moto.url, "sqs")
        dlq_url = sqs.create_queue(QueueName="bench-node-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        agents = {
            "agent": start_agent("bench-progress-off", moto.url, containerd, dlq_arn,
                                 progress_seconds=PROGRESS_OFF_SECONDS, receive_wait=receive_wait),
            "agent_progress": start_agent("bench-progress-on", moto.url, containerd, dlq_arn,
                                          progress_seconds=PROGRESS_ON_SECONDS, receive_wait=receive_wait),
        }
        stack.callback(_stop_all, list(agents.values()))
        print(f"  agents in this process, long-polling their node queues (RECEIVE_WAIT_SECONDS={receive_wait}) on "
              "moto in its own process; the pull timeout is 600 s")

        def pull(way: str) -> dict[str, float]:
            cpu = time.process_time()  # every thread of this process: the agents', gRPC's, boto3's
            figures = ({"total": direct_pull(cri, reference)} if way == "direct"
                       else agent_pull(sqs, agents[way], reference, timeout=600))
            return {**figures, "cpu": time.process_time() - cpu}

        fresh_waits = []
        for _ in range(warmup):
            for way in WAYS:
                pull(way)
                fresh_waits.append(make_fresh(containerd, cri, reference, digests))
        if warmup:
            print(f"  {warmup} untimed warm-up pull(s) each way")
        runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
        for round_ in range(repeat):
            order = ORDERS[round_ % len(ORDERS)]
            for way in order:
                runs[way].append(pull(way))
                fresh_waits.append(make_fresh(containerd, cri, reference, digests))
            print(f"  round {round_ + 1} of {repeat} ({' then '.join(order)}): "
                  + ", ".join(f"{way} {runs[way][-1]['total']:.3f} s" for way in WAYS))
        print("  between pulls: CRI RemoveImage, then none of the image's blobs on disk, no download in progress "
              f"and no snapshot left (after at most {max(fresh_waits):.2f} s of waiting), then sync")
        return summarize(image_mb, runs)


def moto_client(url: str, service: str) -> Any:
    """A boto3 client for moto at `url`."""
    import boto3

    from prewarm_devtools.sam.aws import REGION

    return boto3.client(service, region_name=REGION, endpoint_url=url, aws_access_key_id="local",
                        aws_secret_access_key="local")


def _stop_all(agents: Sequence[NodeAgent]) -> None:
    # In parallel: each stop waits for its consumer's long poll to return.
    threads = [threading.Thread(target=agent.stop, name=f"stop-{agent.node}") for agent in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _medians(runs: list[dict[str, float]], keys: Sequence[str]) -> dict[str, float]:
    return {key: median([run[key] for run in runs]) for key in keys}


def summarize(image_mb: float, runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    direct_s = median([run["total"] for run in runs["direct"]])
    agent_s = median([run["total"] for run in runs["agent"]])
    progress_s = median([run["total"] for run in runs["agent_progress"]])
    for way in WAYS:
        seconds = [run["total"] for run in runs[way]]
        print(f"  {WAY_NAMES[way]:<26} median {median(seconds):7.3f} s  (runs: "
              + ", ".join(f"{s:.3f}" for s in seconds) + ")")
    keys = [key for key, _ in STEPS]
    for way in ("agent", "agent_progress"):
        steps = _medians(runs[way], [*keys, "pulling_reports", "pulling_send"])
        print(f"  where the time of '{WAY_NAMES[way]}' went (medians):")
        for key, name in STEPS:
            print(f"    {name:<82} {steps[key]:8.4f} s")
        outside = sum(steps[key] for key in keys if key != "pull")
        print(f"    {'outside PullImage, on the path':<82} {outside:8.4f} s")
        print(f"    Pulling reports sent while pulling: {steps['pulling_reports']:g}, "
              f"{steps['pulling_send']:.4f} s of SendMessage (after PullImage started, so alongside the pull)")
    inside = median([run["pull"] for run in runs["agent"]])
    own = median([run["total"] - run["pull"] for run in runs["agent"]])
    direct_runs = [run["total"] for run in runs["direct"]]
    print(f"  the agent's own time on the path (total minus its PullImage, per run): median {own * 1000:.1f} ms; "
          f"its PullImage took {inside:.3f} s against {direct_s:.3f} s direct, which itself ranged "
          f"{min(direct_runs):.3f} to {max(direct_runs):.3f} s between runs")
    print("  CPU of this process during a pull (medians): " + ", ".join(
        f"{WAY_NAMES[way]} {median([run['cpu'] for run in runs[way]]) * 1000:.0f} ms" for way in WAYS)
          + " (with the agent: status queue check, confirming the report, not only the agent)")
    bound = TARGET_FACTOR * direct_s + TARGET_SLACK_S
    met = print_targets([Target(f"agent_s (want <= {TARGET_FACTOR:g} x direct_s + {TARGET_SLACK_S:g} s)", agent_s,
                                bound, " s")])
    progress_bound = TARGET_FACTOR * direct_s + TARGET_SLACK_S
    print(f"  with progress every {PROGRESS_ON_SECONDS:g} s: {progress_s:.3f} s, "
          + ("within" if progress_s <= progress_bound else "outside") + " the same bound")
    if not met:
        print("  the target is missed: see the steps above for where the agent's time goes")
    return {
        "image_mb": image_mb,
        "direct_s": round(direct_s, 4),
        "agent_s": round(agent_s, 4),
        "ratio": round(agent_s / direct_s, 4),
        "progress_ratio": round(progress_s / agent_s, 4),
        "agent_progress_s": round(progress_s, 4),
        "agent_own_s": round(own, 4),
        "steps_s": {key: round(value, 4) for key, value in _medians(runs["agent"], keys).items()},
        "load_average": load_average(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/agent_overhead.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image-mb", type=float, default=200.0, help="image size in MiB (default 200)")
    parser.add_argument("--repeat", type=int, default=3, help="timed pulls each way; medians count (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed pulls each way first (default 1)")
    parser.add_argument("--receive-wait", type=int, default=20,
                        help="the agents' RECEIVE_WAIT_SECONDS (default 20, as deployed)")
    args = parser.parse_args(argv)
    if args.image_mb <= 0 or args.repeat < 1 or args.warmup < 0 or not 0 <= args.receive_wait <= 20:
        parser.error("--image-mb must be positive, --repeat at least 1, --warmup not negative, "
                     "--receive-wait 0 to 20")
    require_node_tools("agent_overhead")
    emit(benchmark(args.image_mb, args.repeat, args.warmup, args.receive_wait))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`prewarm local ...` and `prewarm demo`: local mode's commands, added to the `prewarm` CLI as a plugin."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prewarm_cli.targets import (
    LocalState,
    clear_local_state,
    local_state_path,
    local_target,
    process_alive,
    read_local_state,
)

if TYPE_CHECKING:
    from prewarm_devtools.control import ControlClient

from prewarm_cli.errors import EXIT_FAILURE, EXIT_OK, CommandError


@click.group("local")
def local() -> None:
    """Run the whole of Prewarm on this machine (127.0.0.1 only) for `prewarm --local`.

    \b
    `up` starts a moto server with template.yaml deployed, the embedded Kubernetes API (or a real
    cluster), a registry that plays ECR, and one private containerd and agent process per node (root,
    containerd and docker-registry needed; --no-agents runs the control plane alone). It records
    itself in the state file that `prewarm --local` reads, and runs until Ctrl-C or `prewarm local down`.
    `fire`, `node`, `agent` and `status` talk to it; `logs` reads its logs; `down` stops it, or cleans
    up after one that crashed.
    """


def _running_local_stack() -> LocalState | None:
    """The state of a local stack whose process is alive, None when there is none."""
    path = local_state_path()
    if not path.exists():
        return None
    state = read_local_state(path)
    return state if state.running else None


_BANDWIDTH = re.compile(r"(\d+(?:\.\d+)?)\s*(|[kKMG]i?B?|B)(?:/s)?")
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 1024, "M": 1000**2, "MB": 1000**2, "MIB": 1024**2,
          "G": 1000**3, "GB": 1000**3, "GIB": 1024**3, "KI": 1024, "MI": 1024**2, "GI": 1024**3}


def parse_bandwidth(text: str) -> int:
    """`20MiB/s`, `500KB/s`, `1.5M`, `1048576` -> bytes per second."""
    m = _BANDWIDTH.fullmatch(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise click.BadParameter(f"{text!r}: give a rate such as 20MiB/s, 500KB/s or 1048576 (bytes/s)")
    return max(1, int(float(m.group(1)) * _UNITS[m.group(2).upper()]))


def _cleaned(lines: list[str]) -> str:
    return "".join(f"\n  {line}" for line in lines)


def _clean_up_crashed(record_path: Path) -> list[str] | None:
    """Cleans up after a stack whose process has exited; None when there was no record of one."""
    from prewarm_devtools.localrun import clean_up, read_run_record

    record = read_run_record(record_path)
    if record is None:
        return None
    if record.running:
        raise CommandError(f"a local stack is running (pid {record.pid}, run record {record_path}); "
                           "stop it with `prewarm local down`")
    lines = clean_up(record).lines() + _remove_stale_kubeconfig()
    record_path.unlink(missing_ok=True)
    return lines


def _remove_stale_kubeconfig() -> list[str]:
    """The kubeconfig a stack that did not stop left beside the state file, removed (its API is gone)."""
    from prewarm_devtools.localrun import kubeconfig_path

    path = kubeconfig_path(local_state_path())
    if not path.exists():
        return []
    path.unlink(missing_ok=True)
    return [f"removed its kubeconfig {path}"]


@local.command("up")
@click.option("--nodes", type=click.IntRange(min=1), metavar="N",
              help="N synthetic nodes instead of the sample cluster (samplefiles/cluster.yaml).")
@click.option("--clusters", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="EKS clusters the stack serves: the own one (local) and N-1 more (local-2, ... labelled "
                   "env=prod), each an embedded API with the same nodes, registered as `prewarm cluster add` does.")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Use this real cluster instead of the embedded Kubernetes API.")
@click.option("--no-agents", is_flag=True, help="Only the control plane: no containerd, registry or agents.")
@click.option("--stack-name", default="prewarm-local", show_default=True, help="Names the table and queues.")
@click.option("--registry-bandwidth", metavar="RATE",
              help="Limit the nodes' pulls from the registry, e.g. 20MiB/s (to watch progress and cancel).")
@click.option("--agents", "agents_from", type=click.Choice(["process", "image"]), default="process",
              show_default=True,
              help="Run each node's agent as a process, or from the agent image as a container on the node's "
                   "containerd, set up as the installed DaemonSet's pod (build it first: make agent-image).")
@click.option("--agent-image", type=click.Path(dir_okay=False, path_type=Path), metavar="ARCHIVE",
              help="The agent image's OCI archive for --agents image "
                   "[default: build/agent-image/prewarm-agent-<arch>.tar].")
def local_up(nodes: int | None, clusters: int, kubeconfig: str | None, no_agents: bool, stack_name: str,
             registry_bandwidth: str | None, agents_from: str, agent_image: Path | None) -> int:
    """Start a local stack and keep it running until Ctrl-C or `prewarm local down`."""
    from prewarm_devtools.agent_image import default_archive
    from prewarm_devtools.localmode import LocalMode, LocalModeUnavailableError
    from prewarm_devtools.localrun import run_record_path

    bandwidth = parse_bandwidth(registry_bandwidth) if registry_bandwidth else None
    if clusters > 1 and (kubeconfig or agents_from == "image"):
        raise click.UsageError("--clusters plays further clusters with embedded APIs and agent processes: "
                               "not with --kubeconfig or --agents image")
    if agent_image is not None and agents_from != "image":
        raise click.UsageError("--agent-image goes with --agents image")
    if agents_from == "image":
        if kubeconfig:
            raise click.UsageError("--agents image runs the embedded API's DaemonSet: not with --kubeconfig")
        agent_image = agent_image or default_archive()
        if not agent_image.exists():
            raise click.UsageError(f"--agent-image: {agent_image} does not exist; build it with `make agent-image`")
    running = _running_local_stack()
    if running is not None:
        raise CommandError(f"a local stack is already running (pid {running.pid}, {running.endpoint_url}); "
                           "stop it with `prewarm local down`")
    leftovers = _clean_up_crashed(run_record_path(local_state_path()))
    if leftovers:
        click.echo("cleaned up after a local stack that did not stop:" + _cleaned(leftovers))
    mode = LocalMode(nodes=nodes, kubeconfig=kubeconfig, agents=not no_agents, stack_name=stack_name,
                     agent_processes=True, agent_image=agent_image, registry_bandwidth=bandwidth, clusters=clusters)
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        try:
            mode.start()
        except LocalModeUnavailableError as e:
            raise CommandError(str(e)) from e
        assert mode.stack is not None
        env = mode.stack.env()
        click.echo(f"local stack up (pid {os.getpid()}): AWS at {mode.stack.endpoint_url}, "
                   f"table {env.get('TABLE_NAME')}")
        if mode.kube is not None:
            click.echo(f"Kubernetes API at {mode.kube.url}")
        if mode.kubeconfig_written is not None:
            click.echo(f"kubectl as the cluster admin: export KUBECONFIG={mode.kubeconfig_written}")
        if mode.registry is not None:
            limit = f" (nodes pull through {mode.registry_proxy.url}, limited to {bandwidth:,} bytes/s)" \
                if mode.registry_proxy is not None else ""
            click.echo(f"registry (plays ECR) at {mode.registry.url}{limit}")
        click.echo(f"nodes with an agent: {', '.join(sorted(mode.nodes)) or 'none'}")
        for extra in mode.extra_clusters.values():
            click.echo(f"cluster {extra.name} ({','.join(f'{k}={v}' for k, v in extra.labels.items())}): Kubernetes "
                       f"API at {extra.url}, nodes with an agent: {', '.join(sorted(extra.nodes)) or 'none'}")
        click.echo(f"logs in {mode.logs_dir} (`prewarm local logs`)")
        click.echo(f"state in {local_state_path()}; try `prewarm --local get jobs`; Ctrl-C or "
                   "`prewarm local down` stops it")
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        click.echo("", err=True)  # after the terminal's ^C
    finally:
        mode.stop()
        signal.signal(signal.SIGTERM, previous)
    click.echo("local stack stopped")
    return EXIT_OK


@local.command("down")
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, metavar="SECONDS",
              help="How long the stack may take to stop before it is killed.")
def local_down(timeout: float) -> int:
    """Stop the running local stack, or clean up after one that crashed.

    \b
    SIGTERM to the stack's process, then waits until it and every process it started have exited.
    After a crash (or past --timeout, when the stack is killed), stops what it left running, unmounts
    containerd's mounts, removes its run directory and says what it cleaned.
    """
    from prewarm_devtools.localrun import RecordedProcess, clean_up, read_run_record, run_record_path, wait_exited

    path = local_state_path()
    record_path = run_record_path(path)
    record = read_run_record(record_path)
    if record is not None:
        owner = RecordedProcess("local stack", record.pid, record.start_time)
    else:
        if not path.exists():
            # Nothing to stop is what down is for: exit 0, as for a stale state below.
            click.echo(f"no local stack was running (no state file {path})")
            return EXIT_OK
        state = read_local_state(path)
        if state.pid is None or not process_alive(state.pid):
            clear_local_state(path)
            _remove_stale_kubeconfig()
            click.echo(f"no local stack was running; removed its stale state {path}")
            return EXIT_OK
        owner = RecordedProcess("local stack", state.pid)
    notes: list[str] = []
    if owner.running:
        os.kill(owner.pid, signal.SIGTERM)
        if wait_exited([owner], timeout):
            os.kill(owner.pid, signal.SIGKILL)
            wait_exited([owner], 10.0)
            notes.append(f"did not stop within {timeout:g}s: killed it")
        verb = "stopped"
    else:
        verb = "was not running (it crashed or was killed)"
    record = read_run_record(record_path)  # a clean stop removed it, with everything it named
    if record is not None:
        notes += (clean_up(record).lines() + _remove_stale_kubeconfig()) or ["nothing was left behind"]
        record_path.unlink(missing_ok=True)
    clear_local_state(path)
    click.echo(f"local stack (pid {owner.pid}) {verb}" + _cleaned(notes))
    return EXIT_OK


def _control() -> tuple[LocalState, ControlClient]:
    from prewarm_devtools.control import ControlClient

    state = _running_local_stack()
    if state is None:
        raise CommandError("no local stack is running: start one with `prewarm local up`")
    url, token = state.env.get("LOCAL_CONTROL_URL"), state.env.get("LOCAL_CONTROL_TOKEN")
    if not url or not token:
        raise CommandError("the running local stack has no control channel (started by an older prewarm?): "
                           "restart it with `prewarm local down` and `prewarm local up`")
    return state, ControlClient(url, token)


def _call(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    from prewarm_devtools.control import ControlError

    _, client = _control()
    try:
        return client.call(method, path, body)
    except ControlError as e:
        raise CommandError(str(e)) from e


@local.command("status")
def local_status() -> int:
    """Say whether a local stack is running, its endpoints, and every node with its agent (exit 1 when none is)."""
    from prewarm_devtools.control import ControlClient, ControlError

    path = local_state_path()
    state = read_local_state(path)
    alive = state.running
    pairs = [("state", str(path)), ("running", f"yes (pid {state.pid})" if alive else
                                     f"no (pid {state.pid} has exited; `prewarm local down` cleans up)")]
    live: dict[str, Any] = {}
    url, token = state.env.get("LOCAL_CONTROL_URL"), state.env.get("LOCAL_CONTROL_TOKEN")
    problem = None
    if alive and url and token:
        try:
            live = ControlClient(url, token, timeout=10).call("GET", "/status")
        except ControlError as e:
            problem = str(e)
    if run_dir := live.get("run_dir") or state.env.get("LOCAL_RUN_DIR"):
        pairs.append(("run dir", run_dir))
    if kubeconfig := live.get("kubeconfig") or state.env.get("LOCAL_KUBECONFIG"):
        pairs.append(("kubeconfig", f"{kubeconfig}  (kubectl: export KUBECONFIG={kubeconfig})"))
    pairs += [(k.lower().replace("_", " "), state.env[k]) for k in ("TABLE_NAME", "STATUS_QUEUE_URL",
                                                                     "NODE_QUEUE_PREFIX") if k in state.env]
    endpoints = live.get("endpoints") or {
        "aws": state.endpoint_url, **({"kubernetes": state.env["LOCAL_KUBE_API_URL"]}
                                      if "LOCAL_KUBE_API_URL" in state.env else {}),
        **({"registry": state.env["LOCAL_REGISTRY_URL"]} if "LOCAL_REGISTRY_URL" in state.env else {}),
        **({"control": url} if url else {})}
    lines = [f"{(k + ':').ljust(19)}{v}" for k, v in pairs]
    lines.append("endpoints:")
    width = max(len(k) for k in endpoints) + 3
    lines += [f"  {(k + ':').ljust(width)}{v}" for k, v in endpoints.items()]
    if problem:
        lines.append(f"{'control:'.ljust(19)}{problem}")
    if "nodes" in live:
        own = state.env.get("CLUSTER_NAME", "")
        if live.get("api") in ("stopped", "hung"):
            lines.append(f"cluster {own}: Kubernetes API {live['api']} (`prewarm local cluster start {own}`)")
        lines += _node_lines(f"nodes of cluster {own}" if live.get("clusters") else "nodes", live["nodes"])
    for extra in live.get("clusters") or []:
        labels = ",".join(f"{k}={v}" for k, v in sorted(extra["labels"].items())) or "none"
        lines.append(f"cluster {extra['name']}: Kubernetes API at {extra['kubernetes']} ({extra['api']}), "
                     f"labels {labels}")
        lines += _node_lines(f"nodes of cluster {extra['name']}", extra["nodes"])
    click.echo("\n".join(lines))
    return EXIT_OK if alive else EXIT_FAILURE


def _node_lines(title: str, nodes: list[dict[str, Any]]) -> list[str]:
    from prewarm_cli.output import table

    rows = [[n["name"], n["agent"], n["pid"] or "-", n["containerd_pid"] or "-", n.get("containerd_socket") or "-",
             n.get("exit") or "-"] for n in nodes]
    return [f"{title} ({len(nodes)}):", table(["NAME", "AGENT", "PID", "CONTAINERD-PID", "CONTAINERD-SOCKET",
                                               "LAST-EXIT"], rows, indent="  ") if rows else "  none"]


@local.command("fire")
@click.argument("schedule", type=click.Choice(["repull", "sweep", "refresh", "sync", "bakes"]))
def local_fire(schedule: str) -> int:
    """Fire a schedule of the running stack now: the daily re-pull, the sweep, the ECR credential refresh, the
    resource sync, or the bakes' sweep."""
    answer = _call("POST", "/fire", {"schedule": schedule})
    click.echo(f"fired {answer['function']}: {json.dumps(answer.get('result'), sort_keys=True, default=str)}")
    return EXIT_OK


@local.group("node")
def local_node() -> None:
    """Add a node to the running stack's Kubernetes API (with its containerd and agent), or remove one."""


def _labels(text: str | None) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in filter(None, (text or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: labels are key=value, separated by commas", param_hint="--labels")
        labels[key.strip()] = value.strip()
    return labels


def _taint(text: str) -> dict[str, str]:
    keyvalue, sep, effect = text.rpartition(":")
    key, _, value = keyvalue.partition("=")
    if not sep or not key or not effect:
        raise click.BadParameter(f"{text!r}: a taint is key=value:Effect or key:Effect "
                                 "(Effect: NoSchedule, PreferNoSchedule or NoExecute)", param_hint="--taint")
    return {"key": key, "effect": effect, **({"value": value} if value else {})}


@local_node.command("add")
@click.argument("name")
@click.option("--labels", metavar="K=V,...", help="Labels of the node, e.g. pool=gpu,team=ml.")
@click.option("--taint", "taints", multiple=True, metavar="KEY=VALUE:EFFECT", help="A taint; repeatable.")
@click.option("--no-agent", is_flag=True, help="Only the Node object: no containerd, no agent (as a node "
                                               "the DaemonSet has not reached).")
@click.option("--node-class", metavar="NAME", help="A Karpenter EC2NodeClass: the node's containerd starts from "
                                                   "the snapshot its data volume names, as a launched instance's.")
@click.option("--image", "images", multiple=True, metavar="REF",
              help="Pulled into the node's containerd before its agent starts (pre-pulled, or booted warm); "
                   "repeatable.")
def local_node_add(name: str, labels: str | None, taints: tuple[str, ...], no_agent: bool,
                   node_class: str | None, images: tuple[str, ...]) -> int:
    """Add a Ready node NAME; unless --no-agent, start its own containerd and agent."""
    body = {"name": name, "labels": _labels(labels), "taints": [_taint(t) for t in taints], "agent": not no_agent,
            "node_class": node_class, "images": list(images)}
    answer = _call("POST", "/nodes", body)
    agent = f"agent running (pid {answer['pid']})" if answer["agent"] == "running" else "no agent"
    click.echo(f"node/{name} added, {agent}")
    return EXIT_OK


@local_node.command("remove")
@click.argument("name")
def local_node_remove(name: str) -> int:
    """Remove node NAME: stop its agent and containerd, delete its files and its Node object."""
    answer = _call("DELETE", f"/nodes/{name}")
    click.echo(f"node/{name} removed" + (" with its agent and containerd" if answer.get("had_agent") else ""))
    return EXIT_OK


@local_node.command("kubelet")
@click.argument("name")
@click.option("--policy", type=click.Choice(["NeverVerify", "NeverVerifyPreloadedImages",
                                             "NeverVerifyAllowlistedImages", "AlwaysVerify", "off"]),
              required=True, help="The kubelet's imagePullCredentialsVerificationPolicy (KEP-2535); off: the "
                                  "feature gate off, as before Kubernetes 1.35.")
@click.option("--allowlist", metavar="IMAGE,...", default="",
              help="preloadedImagesVerificationAllowlist (NeverVerifyAllowlistedImages): host/repo or host/path/*.")
def local_node_kubelet(name: str, policy: str, allowlist: str) -> int:
    """Set the image credential policy node NAME's kubelet reports at /configz (docs/credentials.md)."""
    entries = [e.strip() for e in allowlist.split(",") if e.strip()]
    _call("POST", f"/nodes/{name}/kubelet", {"policy": None if policy == "off" else policy, "allowlist": entries})
    click.echo(f"node/{name} kubelet imagePullCredentialsVerificationPolicy: {policy}")
    return EXIT_OK


@local.command("agent")
@click.argument("action", type=click.Choice(["stop", "kill", "start"]))
@click.argument("node")
def local_agent(action: str, node: str) -> int:
    """Stop (SIGTERM: drain, then exit), kill (SIGKILL, as a crash) or start NODE's agent."""
    answer = _call("POST", f"/agents/{node}/{action}")
    if answer["agent"] == "running":
        click.echo(f"agent of {node} running (pid {answer['pid']})")
    else:
        click.echo(f"agent of {node} {'killed' if action == 'kill' else 'stopped'}")
    return EXIT_OK


@local.command("cluster")
@click.argument("action", type=click.Choice(["stop", "start"]))
@click.argument("name")
@click.option("--hang", is_flag=True,
              help="With stop: the API accepts connections and never answers (packets dropped), not refusing them.")
def local_cluster(action: str, name: str, hang: bool) -> int:
    """Stop or start local cluster NAME's Kubernetes API, its objects kept: stopped, its port refuses
    connections (a dead endpoint), or with --hang accepts them and never answers (an endpoint whose packets
    are dropped), while its nodes and agents go on, so you can try an outage. `start` ends either."""
    if hang and action != "stop":
        raise click.UsageError("--hang goes with stop")
    answer = _call("POST", f"/clusters/{name}/{action}", {"hang": True} if hang else None)
    click.echo(f"cluster {name}: Kubernetes API {answer['api']} at {answer['kubernetes']}")
    return EXIT_OK


@local.command("logs")
@click.option("--agent", "agent", metavar="NODE", help="Only this node's agent's log.")
@click.option("--function", "function", metavar="NAME", help="Only this function's lines (dispatch_job, sweep...).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until Ctrl-C or the stack stops.")
def local_logs(agent: str | None, function: str | None, follow: bool) -> int:
    """Print the local stack's logs: every function's (JSON, one line each) and every agent's.

    \b
    Without --agent or --function, every log, each line prefixed with where it comes from.
    """
    from prewarm_devtools.logs import LogSource, follow_logs, stack_logs

    if agent and function:
        raise click.UsageError("--agent and --function exclude each other")
    logs_dir, owner = stack_logs()
    sources: list[LogSource]
    if agent:
        sources = [LogSource.of_agent(logs_dir, agent)]
    elif function:
        sources = [LogSource.of_function(logs_dir, function)]
    else:
        sources = LogSource.every(logs_dir)
    with contextlib.suppress(KeyboardInterrupt):
        follow_logs(sources, follow=follow, prefix=len(sources) > 1, alive=owner)
    return EXIT_OK


@local.command("push")
@click.argument("image", metavar="REPOSITORY[:TAG]")
@click.option("--size-mb", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Size of the image's layers together (random, incompressible data).")
@click.option("--layers", type=click.IntRange(min=1, max=127), default=1, show_default=True,
              help="How many layers: each pull makes a request per layer, against the registry's quota and budget.")
def local_push(image: str, size_mb: float, layers: int) -> int:
    """Build a test image, push it to the local registry that plays ECR, and emit ECR's PUSH event.

    \b
    REPOSITORY is an ECR repository name (`platform/web`), or the full local ECR reference
    (`123456789012.dkr.ecr.us-west-2.amazonaws.com/platform/web:v2`). Without TAG the push is
    untagged, as a digest-only push to ECR is. Rules that match create their jobs in the running stack.
    """
    from prewarm_devtools.localecr import ecr_host, push_to_local_ecr

    state = _running_local_stack()
    if state is None:
        raise CommandError("no local stack is running: start one with `prewarm local up`")
    registry, bus = state.env.get("LOCAL_REGISTRY_URL"), state.env.get("LOCAL_EVENT_BUS_URL")
    if not registry or not bus:
        raise CommandError("the running local stack has no registry (started with --no-agents?): nothing to push to")
    repository, _, tag = image.removeprefix(ecr_host() + "/").partition(":")
    if not repository or "@" in image:
        raise click.UsageError(f"IMAGE {image!r}: give REPOSITORY[:TAG], e.g. platform/web:v2")
    target = local_target(state)
    pushed, event = push_to_local_ecr(registry, target.client("ecr"), repository, tag or None, size_mb=size_mb,
                                      layers=layers)
    target.client("sqs").send_message(QueueUrl=bus, MessageBody=json.dumps(event))
    click.echo(f"pushed {pushed.reference} ({pushed.size_bytes:,} bytes); ECR PUSH event sent")
    return EXIT_OK


@click.command()
@click.option("--nodes", type=click.IntRange(min=0), default=3, show_default=True, metavar="N",
              help="Synthetic nodes, each with its own containerd and agent (0: the sample cluster).")
@click.option("--image-mb", type=click.FloatRange(min=0, min_open=True), default=50.0, show_default=True,
              help="Size of the pushed demo image.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: the last line on stdout is one JSON report.")
@click.option("--timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, metavar="SECONDS",
              help="How long the pre-warm may take.")
@click.option("--keep", is_flag=True, help="Leave local mode running afterwards (Ctrl-C stops it).")
def demo(nodes: int, image_mb: float, output: str, timeout: float, keep: bool) -> int:
    """Local mode end to end: rules, a push to the local ECR, live progress, pulls verified through CRI.

    Exit 0 only when every eligible node has the image.
    """
    from prewarm_devtools.demo import DemoFailedError, run_demo
    from prewarm_devtools.localmode import LocalModeUnavailableError

    try:
        result = run_demo(nodes=nodes or None, image_mb=image_mb, output=output, keep=keep, timeout=timeout)
    except (LocalModeUnavailableError, DemoFailedError) as e:
        raise CommandError(str(e)) from e
    return EXIT_OK if result.ok else EXIT_FAILURE


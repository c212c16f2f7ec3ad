"""`prewarm get` in every output format, and `prewarm describe` with node rows driven through the control plane."""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from prewarm.domain.messages import Footprint, Hello, RemovedImage, Warmed
from prewarm.services.reports import register_node
from prewarm.services.status_batches import record_status
from tests.support.cli import Run
from tests.support.cluster_directory import clusters_of
from tests.support.control_plane import ControlPlane
from tests.support.manifests import job_yaml

pytestmark = pytest.mark.integration

MIB = 2**20


@pytest.fixture(scope="module")
def running_job(control_plane: ControlPlane, state_file: Path) -> str:
    """`get-web` on node-a..c plus a missing node-d: node-a succeeded, node-b failed, node-c sent its task."""
    from click.testing import CliRunner

    from prewarm_cli.app import cli

    manifest = job_yaml("get-web", nodes=("node-a", "node-b", "node-c", "node-d"), parallelism=2)
    result = CliRunner().invoke(cli, ["--local", "apply", "-f", "-"], input=manifest,
                                env={"PREWARM_LOCAL_STATE": str(state_file)})
    assert result.exit_code == 0, result.output
    control_plane.plan("get-web")
    control_plane.report("get-web", "node-a", "Pulling", bytes_done=10 * MIB, bytes_total=40 * MIB)
    control_plane.report("get-web", "node-a", "Succeeded", bytes_done=40 * MIB, bytes_total=40 * MIB)
    control_plane.report("get-web", "node-b", "Failed", attempt=4, message="failed to pull: 401 Unauthorized")
    return "get-web"


def test_get_jobs_prints_kruise_columns(prewarm: Run, running_job: str) -> None:
    # When the jobs of the default namespace are listed
    result = prewarm("get", "jobs")

    # Then the header is Kruise's and the row carries the job's counters and message
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "AGE", "SOURCE", "MESSAGE"]
    row = next(line for line in lines if line.startswith("get-web "))
    assert row.split()[:5] == ["get-web", "3", "1", "1", "1"] and row.split()[6] == "cli"
    assert row.endswith("job is running, progress 66.7%; named node node-d excluded: node not found")


def test_get_jobs_wide_across_namespaces_adds_namespace_image_parallelism_and_round(
    prewarm: Run, running_job: str
) -> None:
    # Given a job in another namespace
    assert prewarm("apply", "-f", "-", input=job_yaml("get-other", namespace="team-b")).exit_code == 0

    # When every namespace is listed wide
    result = prewarm("get", "jobs", "-A", "-o", "wide")

    # Then both namespaces show, with the wide columns
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["NAMESPACE", "NAME", "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "AGE", "SOURCE", "MESSAGE",
                              "IMAGE", "PARALLELISM", "ROUND"]
    web = next(r for r in rows if " get-web " in r).split()
    assert (web[0], web[-3:]) == ("default", ["nginx:1.25", "2", "0"])
    assert any(r.split()[:2] == ["team-b", "get-other"] for r in rows)


def test_get_job_yaml_is_the_manifest_with_a_kruise_status(prewarm: Run, running_job: str) -> None:
    # When one job is shown as YAML
    result = prewarm("get", "job", "get-web", "-o", "yaml")

    # Then it is the applied manifest, server metadata, and Kruise's status fields
    doc = yaml.safe_load(result.stdout)
    assert (doc["apiVersion"], doc["kind"], doc["spec"]["image"]) == (
        "apps.kruise.io/v1alpha1", "ImagePullJob", "nginx:1.25")
    assert {"uid", "generation", "creationTimestamp"} <= doc["metadata"].keys()
    status = doc["status"]
    assert {k: status[k] for k in ("desired", "active", "succeeded", "failed", "failedNodes", "message")} == {
        "desired": 3, "active": 1, "succeeded": 1, "failed": 1, "failedNodes": ["node-b"],
        "message": "job is running, progress 66.7%; named node node-d excluded: node not found",
    }
    assert status["startTime"].endswith("Z") and "completionTime" not in status


def test_get_jobs_json_is_a_list_and_name_prints_kind_slash_name(prewarm: Run, running_job: str) -> None:
    # When all jobs are shown as JSON and by name
    as_json = json.loads(prewarm("get", "jobs", "-o", "json").stdout)
    names = prewarm("get", "jobs", "-o", "name").stdout.splitlines()

    # Then JSON is a `kind: List` of the jobs, and names are kubectl's resource/name form
    assert as_json["kind"] == "List"
    assert "get-web" in [item["metadata"]["name"] for item in as_json["items"]]
    assert "imagepulljob.apps.kruise.io/get-web" in names


def test_get_rules_in_table_and_yaml(prewarm: Run) -> None:
    # Given a rule
    rule = textwrap.dedent("""\
        apiVersion: prewarm.dev/v1alpha1
        kind: PrewarmRule
        metadata: {name: get-rule}
        spec:
          repositories: ["ml/*", "base"]
          tags: ["v*"]
          template: {metadata: {namespace: ml}}
        """)
    assert prewarm("apply", "-f", "-", input=rule).exit_code == 0

    # When rules are listed as a table and the rule as YAML
    listed = prewarm("get", "rules")
    shown = prewarm("get", "rule", "get-rule", "-o", "yaml")

    # Then the columns say what it matches and where its jobs go; the YAML is the rule
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "REPOSITORIES", "TAGS", "NAMESPACE", "AGE"]
    assert next(r for r in rows if r.startswith("get-rule ")).split() == ["get-rule", "ml/*,base", "v*", "ml",
                                                                          "<unknown>"]
    doc = yaml.safe_load(shown.stdout)
    assert (doc["kind"], doc["metadata"]["name"], doc["spec"]["repositories"]) == ("PrewarmRule", "get-rule",
                                                                                  ["ml/*", "base"])


def test_get_nodes_lists_registered_agents(prewarm: Run, control_plane: ControlPlane) -> None:
    # Given an agent that said hello 90 seconds ago
    hello = Hello(node="node-hello", labels={"pool": "gpu", "kubernetes.io/arch": "arm64"}, architecture="arm64",
                  queue_url=control_plane.queues.queue_url("node-hello"))
    said_at = time.time() - 90
    register_node(control_plane.store, control_plane.queues, None, hello, now=said_at)

    # When nodes are listed as a table and as JSON
    table = prewarm("get", "nodes")
    listed_by = time.time()
    as_json = json.loads(prewarm("get", "node", "node-hello", "-o", "json").stdout)

    # Then the row shows its agent, architecture, the well-known labels, and the hello's age
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["NAME", "AGENT", "ARCH", "INSTANCE-TYPE", "ZONE", "LAST-HELLO", "WARM", "BOOT",
                              "CONDITION", "MESSAGE"]
    row = next(r for r in rows if r.startswith("node-hello ")).split()
    assert row[:5] == ["node-hello", "Registered", "arm64", "<none>", "<none>"]
    # (the age as of the listing, however long the command took to start)
    assert 90 <= int(row[5].removesuffix("s")) <= listed_by - said_at + 1
    assert row[6:] == ["ago", "<none>", "0/0", "<none>"]
    assert as_json["metadata"]["name"] == "node-hello" and as_json["status"]["architecture"] == "arm64"
    assert as_json["kind"] == "PrewarmNode" and as_json["status"]["agent"] == "Registered"
    # ... and, this stack naming no reachable cluster, it says it shows the agents' nodes only
    assert "warning: cannot reach the cluster (" in table.stderr
    assert "only nodes whose agent said hello are shown" in table.stderr


def test_get_nodes_is_compact_and_show_labels_or_wide_give_every_label(
    prewarm: Run, control_plane: ControlPlane
) -> None:
    # Given an agent on an EKS-like node with dozens of labels
    labels = {f"feature.node.kubernetes.io/cpu-cpuid.{i:02d}": "true" for i in range(40)}
    labels |= {"node.kubernetes.io/instance-type": "g5.2xlarge", "topology.kubernetes.io/zone": "us-west-2b"}
    hello = Hello(node="node-labels", labels=labels, architecture="amd64",
                  queue_url=control_plane.queues.queue_url("node-labels"))
    register_node(control_plane.store, control_plane.queues, None, hello, now=time.time())

    # When nodes are listed plainly, with --show-labels and wide
    plain = prewarm("get", "node", "node-labels")
    labelled = prewarm("get", "node", "node-labels", "--show-labels")
    wide = prewarm("get", "node", "node-labels", "-o", "wide")

    # Then the plain row is short and names the instance type and zone; the others add every label
    assert len(plain.stdout.splitlines()[1]) < 100
    assert plain.stdout.splitlines()[1].split()[:5] == ["node-labels", "Registered", "amd64", "g5.2xlarge",
                                                        "us-west-2b"]
    assert "cpu-cpuid" not in plain.stdout
    assert labelled.stdout.splitlines()[0].split()[-1] == "LABELS"
    assert labelled.stdout.count("cpu-cpuid") == 40
    assert wide.stdout.splitlines()[0].split() == ["NAME", "AGENT", "ARCH", "INSTANCE-TYPE", "ZONE", "LAST-HELLO",
                                                   "WARM", "BOOT", "CONDITION", "MESSAGE", "QUEUE", "OS",
                                                   "QUEUE-URL", "LABELS"]
    assert wide.stdout.count("cpu-cpuid") == 40


def test_get_a_missing_job_exits_1_naming_it(prewarm: Run) -> None:
    # When a job that does not exist is asked for
    result = prewarm("get", "job", "nope")

    # Then one line names it and its namespace
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == 'error: job "nope" not found in namespace "default"\n'


def test_get_an_unknown_resource_type_is_a_usage_error(prewarm: Run) -> None:
    result = prewarm("get", "deployments")

    assert result.exit_code == 2
    assert result.stderr.startswith('error: "get" does not know the resource type "deployments": use jobs, rules')


def test_describe_job_shows_spec_status_node_rows_and_excluded_nodes(prewarm: Run, running_job: str) -> None:
    # When the job is described
    result = prewarm("describe", "job", "get-web")

    # Then spec and status are summarised and each node has a row
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert "Image:             nginx:1.25" in text
    assert "Selector:          names node-a, node-b, node-c, node-d" in text
    fields = re.sub(r"^(\s*[A-Z][\w ]*:) +", r"\1 ", text, flags=re.M)  # whatever the widest key's width
    assert "  Failed Nodes: node-b" in fields
    assert "  Message: job is running, progress 66.7%" in fields
    lines = text.splitlines()
    header = lines.index("Nodes (3: 1 Succeeded, 1 Failed, 1 Waiting):")
    assert lines[header + 1].split() == [
        "NODE", "PHASE", "SENT", "REPORTED", "ATTEMPTS", "PROGRESS", "DURATION", "MESSAGE"
    ]
    rows = {line.split()[0]: line for line in lines[header + 2: header + 5]}
    assert "Succeeded" in rows["node-a"] and "40.0 MiB/40.0 MiB (100%)" in rows["node-a"]
    assert rows["node-b"].split()[1:2] == ["Failed"] and rows["node-b"].endswith("failed to pull: 401 Unauthorized")
    assert rows["node-b"].split()[6] == "4"  # attempts, after SENT and REPORTED "Ns ago"
    # Its task was sent, it has not reported, and no agent on it ever said hello
    assert rows["node-c"].split()[1:6] == ["Waiting", rows["node-c"].split()[2], "ago", "-", "0"]
    assert rows["node-c"].endswith("no agent on node")
    excluded = lines.index("Excluded Nodes (1):")
    assert lines[excluded + 2].split(maxsplit=1) == ["node-d", "node not found"]


def test_describe_list_job_shows_its_image_pull_jobs(prewarm: Run) -> None:
    # Given a list job of two images
    manifest = textwrap.dedent("""\
        apiVersion: apps.kruise.io/v1beta1
        kind: ImageListPullJob
        metadata: {name: describe-list}
        spec:
          images: [busybox:1.36, alpine:3.20]
        """)
    assert prewarm("apply", "-f", "-", input=manifest).exit_code == 0

    # When it is described
    result = prewarm("describe", "job", "describe-list")

    # Then each image's ImagePullJob has a row
    lines = result.stdout.splitlines()
    start = lines.index("ImagePullJobs (2):")
    assert lines[start + 1].split() == ["NAME", "IMAGE", "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "MESSAGE"]
    images = sorted(line.split()[1] for line in lines[start + 2: start + 4])
    assert images == ["alpine:3.20", "busybox:1.36"]
    assert all(line.split()[0].startswith("describe-list-") for line in lines[start + 2: start + 4])


def test_describe_a_missing_job_exits_1(prewarm: Run) -> None:
    result = prewarm("describe", "job", "nope", "-n", "team-x")

    assert (result.exit_code, result.stderr) == (1, 'error: job "nope" not found in namespace "team-x"\n')


def test_what_get_prints_as_yaml_applies_back_unchanged(prewarm: Run, running_job: str) -> None:
    # Given every job of the namespace as `get -o yaml` prints it (status, uid and timestamps included)
    listing = prewarm("get", "jobs", "-o", "yaml").stdout

    # When that is applied
    result = prewarm("apply", "-f", "-", input=listing)

    # Then nothing changes
    assert result.exit_code == 0, result.stderr
    assert result.stdout and all(line.endswith(" unchanged") for line in result.stdout.splitlines())


def test_a_node_that_joined_with_the_startup_taint_shows_its_hello_to_warm_time(
    prewarm: Run, control_plane: ControlPlane
) -> None:
    # Given a node that joined 60 s ago holding the startup taint, and another still warming
    now = time.time()
    for node in ("node-warm", "node-warming"):
        hello = Hello(node=node, architecture="amd64", queue_url=control_plane.queues.queue_url(node),
                      warm_until=now + 840)
        register_node(control_plane.store, control_plane.queues, None, hello, now=now - 52)
    # ... whose agent reported the taint off 40 s after its hello (SQS may deliver it before the hello:
    # a Warmed for a node not registered yet goes back to the queue)
    warmed = Warmed(node="node-warm", joined_at=now - 60, hello_at=now - 52, warm_at=now - 12, outcome="warm")
    early = record_status(control_plane.store, control_plane.queues, clusters_of(control_plane.store),
                          [("m0", warmed.model_copy(update={"node": "node-unknown"}))], now=now)
    assert early.retry_ids == ["m0"] and early.warmed == []
    done = record_status(control_plane.store, control_plane.queues, clusters_of(control_plane.store),
                         [("m1", warmed)], now=now)
    assert done.retry_ids == [] and done.warmed == ["node-warm"]

    # When nodes are listed and the warm node is described
    table = prewarm("get", "nodes").stdout.splitlines()
    described = prewarm("describe", "node", "node-warm")
    as_yaml = yaml.safe_load(prewarm("get", "node", "node-warm", "-o", "yaml").stdout)

    # Then the table shows hello-to-warm for one and `warming` for the other
    assert next(r for r in table if r.startswith("node-warm ")).split()[7] == "40s"
    warming = next(r for r in table if r.startswith("node-warming ")).split()
    assert warming[7] == "warming" and warming[10:] == ["startup", "taint", "held", "by", "its", "agent", "until",
                                                        "its", "images", "are", "present,", "13m", "more", "at",
                                                        "most"]
    # ... describe gives the times from the join, and the YAML the figures
    assert described.exit_code == 0, described.output
    assert "Startup Taint: warm: every required image was present" in described.stdout
    assert "Hello To Warm: 40s" in described.stdout and "Join To Warm:  48s" in described.stdout
    assert as_yaml["status"]["startupTaint"]["outcome"] == "warm"
    assert as_yaml["status"]["startupTaint"]["helloToWarmSeconds"] == pytest.approx(40, abs=0.01)

    # And a restarted agent's hello (no taint now) keeps it, while a new join with the taint starts over
    later = Hello(node="node-warm", architecture="amd64", queue_url=control_plane.queues.queue_url("node-warm"))
    register_node(control_plane.store, control_plane.queues, None, later, now=now)
    node = control_plane.store.get_node("node-warm")
    assert node is not None and node.warm is not None and node.warm.hello_to_warm == pytest.approx(40)
    register_node(control_plane.store, control_plane.queues, None, later.model_copy(update={"warm_until": now + 900}),
                  now=now)
    node = control_plane.store.get_node("node-warm")
    assert node is not None and node.warm is None and node.warm_until == pytest.approx(now + 900)


def test_a_node_whose_taint_came_off_at_the_deadline_names_what_was_missing(
    prewarm: Run, control_plane: ControlPlane
) -> None:
    # Given a node whose taint came off at maxWarmSeconds with 23 images missing (the message names 20)
    now = time.time()
    hello = Hello(node="node-cold", queue_url=control_plane.queues.queue_url("node-cold"), warm_until=now - 1)
    register_node(control_plane.store, control_plane.queues, None, hello, now=now - 905)
    missing = [f"r.example/team/image-{i:02d}:v1" for i in range(20)]
    warmed = Warmed(node="node-cold", joined_at=now - 910, hello_at=now - 905, warm_at=now - 10, outcome="timeout",
                    missing=missing, missing_total=23)
    assert record_status(control_plane.store, control_plane.queues, clusters_of(control_plane.store),
                         [("m", warmed)], now=now).warmed

    # When it is described and listed
    described = prewarm("describe", "node", "node-cold").stdout
    row = next(r for r in prewarm("get", "nodes").stdout.splitlines() if r.startswith("node-cold "))

    # Then it says the taint came off at the deadline, lists the 20 images and how many more
    assert "removed at maxWarmSeconds with images missing" in described
    assert "Missing (23):" in described and "image-19:v1" in described and "... and 3 more" in described
    assert row.split()[7:9] == ["timeout", "15m"]
    assert row.endswith("startup taint removed at maxWarmSeconds with 23 images missing (prewarm describe node "
                        "node-cold)")


def test_describe_an_unregistered_node_exits_1_naming_it(prewarm: Run) -> None:
    result = prewarm("describe", "node", "node-nobody")
    assert result.exit_code == 1
    assert 'node "node-nobody" not registered' in result.output


def test_describe_node_shows_prewarms_footprint_and_the_bytes_its_removals_freed(
    prewarm: Run, control_plane: ControlPlane
) -> None:
    # Given a node whose agent reported holding two images of Prewarm's after a removal freed 2 MB
    now = time.time()
    hello = Hello(node="node-lean", architecture="amd64", queue_url=control_plane.queues.queue_url("node-lean"))
    register_node(control_plane.store, control_plane.queues, None, hello, now=now - 30)
    removed = RemovedImage(image="r.example/app@sha256:" + "1" * 64, image_id="sha256:" + "2" * 64,
                           bytes_freed=2_000_000, removed_at=now - 11)
    footprint = Footprint(node="node-lean", at=now - 10, images=2, bytes=7_340_032, freed_bytes=2_000_000,
                          removed=[removed])
    assert record_status(control_plane.store, control_plane.queues, clusters_of(control_plane.store),
                         [("m", footprint)], now=now).footprints == ["node-lean"]

    # When it is described, and a node whose agent never reported one
    described = prewarm("describe", "node", "node-lean").stdout
    hello = Hello(node="node-new", architecture="amd64", queue_url=control_plane.queues.queue_url("node-new"))
    register_node(control_plane.store, control_plane.queues, None, hello, now=now)
    fresh = prewarm("describe", "node", "node-new").stdout

    # Then the footprint and the bytes freed are shown
    assert "Prewarm Footprint: 7,340,032 bytes in 2 images pulled by Prewarm" in described
    assert "Bytes Freed:" in described and "2,000,000 (images Prewarm removed" in described
    assert "Prewarm Footprint: none reported" in fresh

"""Local mode's EC2 for warm snapshots: what AWS does with the builders and snapshots moto only records.

- A builder instance (RunInstances tagged `prewarm.dev/role=builder`) is a local node: its own containerd,
  whose root stands for the instance's data volume, and the agent in bake mode (`python -m
  prewarm_agent.baking`, with the bake its user data carries), signing as the stack's BuilderRole.
- StopInstances stops that containerd; TerminateInstances removes it.
- A snapshot (CreateSnapshot of a builder's volume) is a kept copy of that root. moto completes snapshots
  at once and emits no event: the copy is made, then `EBS Snapshot Notification` goes on the local event
  bus, as EventBridge delivers it (`fail_snapshots` makes the next ones fail, as EBS may; `drop_events`
  loses them; `hold_agents` keeps the next builders from running their agent).
- `restore` gives a new node's containerd the root of a snapshot, as EC2 makes a volume from it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prewarm.adapters.ec2 import ROLE_TAG, STACK_TAG
from prewarm.domain.builders import read_bake_document
from prewarm_devtools.account import ACCOUNT, REGION
from prewarm_devtools.aws_limits.ec2 import finish_snapshot
from prewarm_devtools.localecr import ecr_host
from prewarm_devtools.sam.aws import LocalIdentity

log = logging.getLogger(__name__)

CRD_PATH = Path(__file__).parent / "karpenter" / "ec2nodeclass-crd.yaml"


def create_builder_profile(iam: Any, stack: Any) -> str:
    """What CloudFormation makes of the template's BuilderInstanceProfile in moto's IAM, which RunInstances
    looks up: the profile holding BuilderRole under the template's path (the role's ARN is what the bake
    role's `iam:PassRole` grant names). Returns the profile's ARN."""
    role = stack.physical["BuilderRole"]
    path = role.attrs["Arn"].split(":role", 1)[1].removesuffix(role.ref)
    iam.create_role(RoleName=role.ref, Path=path, AssumeRolePolicyDocument="{}")
    profile = stack.physical["BuilderInstanceProfile"].ref
    arn = str(iam.create_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Arn"])
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=role.ref)
    return arn


@dataclass
class Builder:
    instance_id: str
    volume_id: str
    containerd: Any
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False


@dataclass
class LocalBuilders:
    """Polls moto's EC2 (as the operator) and plays the builders and snapshots of the stack."""

    base_dir: Path
    ec2: Any
    stack: Any
    registry_url: str
    logs_dir: Path
    builders: dict[str, Builder] = field(default_factory=dict)
    snapshots: dict[str, Path] = field(default_factory=dict)
    fail_snapshots: str = ""  # a cause: the next snapshots fail with it
    hold_agents: bool = False  # builders launched now run no agent (they never report), as one that hangs
    drop_events: bool = False  # snapshots' notifications are lost, as an EventBridge delivery may be
    last_restore_seconds: float = 0.0  # how long the last `restore` took (benchmarks/boot_warm.py)
    layer: Any = None  # the AWS limits layer: its snapshots stay `pending` until their copy is made here
    _count: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def identity(self) -> LocalIdentity:
        """The builders' instance role (BuilderRole), with its policies as IAM evaluates them."""
        arn = self.stack.physical["BuilderRole"].attrs["Arn"]
        identity = LocalIdentity.of_role(arn, "BU")
        identity.register(self.stack.role_policies.get(arn))
        return identity

    def start(self, interval: float = 0.2) -> LocalBuilders:
        if self.layer is not None:
            self.layer.hold_snapshots(True)

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    self.poll()
                except Exception:
                    log.exception("local builders: poll failed")

        self._thread = threading.Thread(target=run, name="local-builders", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.layer is not None:
            self.layer.hold_snapshots(False)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for builder in self.builders.values():
            self._halt(builder)

    def poll(self) -> None:
        with self._lock:
            reservations = self.ec2.describe_instances(Filters=[
                {"Name": f"tag:{ROLE_TAG}", "Values": ["builder"]}])["Reservations"]
            for instance in (i for r in reservations for i in r["Instances"]):
                self._instance(instance)
            # Only the snapshots still to finish: moto's EC2 owns some 1,300 completed snapshots of its default
            # AMIs, and listing them all on each poll kept a core busy. Under the limits layer every snapshot
            # is pending until finished here; without it, moto completes the stack's at once.
            unfinished = ({"Name": "status", "Values": ["pending"]} if self.layer is not None
                          else {"Name": "tag-key", "Values": [STACK_TAG]})
            for snapshot in self.ec2.describe_snapshots(OwnerIds=["self"], Filters=[unfinished])["Snapshots"]:
                # not the stack's (listed only as pending, under the layer): EBS's part alone
                if all(tag["Key"] != STACK_TAG for tag in snapshot.get("Tags") or ()):
                    finish_snapshot(snapshot["SnapshotId"], account=ACCOUNT, region=REGION)
                elif snapshot["SnapshotId"] not in self.snapshots:
                    self._snapshot(snapshot)

    def _instance(self, instance: dict[str, Any]) -> None:
        instance_id, state = instance["InstanceId"], instance["State"]["Name"]
        builder = self.builders.get(instance_id)
        if builder is None and state == "running":
            self.builders[instance_id] = self._launch(instance)
        elif builder is not None and state in ("stopping", "stopped") and not builder.stopped:
            self._halt(builder)
        elif builder is not None and state in ("shutting-down", "terminated"):
            self._halt(builder)
            shutil.rmtree(builder.containerd.base_dir, ignore_errors=True)
            del self.builders[instance_id]

    def _launch(self, instance: dict[str, Any]) -> Builder:
        from prewarm_devtools.node.containerd import PrivateContainerd

        self._count += 1
        containerd = PrivateContainerd(self.base_dir / f"b{self._count}")
        containerd.add_registry_mirror(ecr_host(), self.registry_url)
        containerd.start()
        volume = next(m["Ebs"]["VolumeId"] for m in instance.get("BlockDeviceMappings", [])
                      if m["DeviceName"] != instance.get("RootDeviceName"))
        builder = Builder(instance["InstanceId"], volume, containerd)
        user_data = self.ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
        encoded = user_data.get("UserData", {}).get("Value", "")
        document = read_bake_document(base64.b64decode(encoded).decode())
        document_arg = base64.b64encode(json.dumps(document).encode()).decode()
        # As the instance's role, which the instance metadata hands the agent on EC2.
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
               "AWS_ENDPOINT_URL": self.stack.endpoint_url, "AWS_REGION": REGION,
               "CRI_SOCKET": str(containerd.socket_path), **self.identity.environment()}
        if self.hold_agents:
            return builder
        out = (self.logs_dir / f"builder-{instance['InstanceId']}.log").open("ab")
        builder.process = subprocess.Popen([sys.executable, "-m", "prewarm_agent.baking", document_arg],
                                           env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        log.info("builder %s started for bake %s", instance["InstanceId"], document["bake"])
        return builder

    def _halt(self, builder: Builder) -> None:
        if builder.process is not None and builder.process.poll() is None:
            builder.process.kill()
            builder.process.wait(10)
        if not builder.stopped:
            builder.containerd.stop()
            builder.stopped = True

    def _snapshot(self, snapshot: dict[str, Any]) -> None:
        snapshot_id = snapshot["SnapshotId"]
        builder = next((b for b in self.builders.values() if b.volume_id == snapshot["VolumeId"]), None)
        kept = self.base_dir / "snapshots" / snapshot_id
        cause = self.fail_snapshots
        if builder is None:
            cause = cause or f"volume {snapshot['VolumeId']} is no builder's here"
        if not cause:
            assert builder is not None
            self._halt(builder)  # a snapshot of a running volume would be crash-consistent at best
            kept.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-a", "--reflink=auto", str(builder.containerd.root_dir), str(kept)], check=True)
        self.snapshots[snapshot_id] = kept
        if self.layer is not None:
            finish_snapshot(snapshot_id, failed=bool(cause), account=ACCOUNT, region=REGION)
        if not self.drop_events:
            self._emit(snapshot, "failed" if cause else "succeeded", cause)

    def _emit(self, snapshot: dict[str, Any], result: str, cause: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = {
            "version": "0", "id": f"local-{snapshot['SnapshotId']}", "detail-type": "EBS Snapshot Notification",
            "source": "aws.ec2", "account": ACCOUNT, "time": now, "region": REGION,
            "resources": [f"arn:aws:ec2::{REGION}:snapshot/{snapshot['SnapshotId']}"],
            "detail": {"event": "createSnapshot", "result": result, "cause": cause, "request-id": "",
                       "snapshot_id": f"arn:aws:ec2::{REGION}:snapshot/{snapshot['SnapshotId']}",
                       "source": f"arn:aws:ec2::{REGION}:volume/{snapshot['VolumeId']}",
                       "startTime": now, "endTime": now},
        }
        self.stack.sqs.send_message(QueueUrl=self.stack.event_bus_url, MessageBody=json.dumps(event))

    def restore(self, snapshot_id: str, root_dir: Path) -> None:
        """Fills a containerd root (not yet started) from a snapshot, as a volume made from it holds it."""
        kept = self.snapshots.get(snapshot_id)
        if kept is None or not kept.exists():
            raise LookupError(f"snapshot {snapshot_id} was not made here")
        started = time.monotonic()
        shutil.rmtree(root_dir, ignore_errors=True)
        root_dir.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", "--reflink=auto", str(kept), str(root_dir)], check=True)
        # The copy on disk before the node boots, as EBS's volume is whole before its instance starts: else
        # its writeback lands on containerd's start (its database's fsyncs wait for it), a cost of the local
        # stand-in that no instance booted from a snapshot pays.
        subprocess.run(["sync", "-f", str(root_dir)], check=True)
        self.last_restore_seconds = time.monotonic() - started

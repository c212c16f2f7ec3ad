"""Clients for the container runtime on its unix socket.

``CriImageClient`` speaks the Kubernetes CRI (``runtime.v1`` ImageService, plus RuntimeService
``Version``) exactly as the kubelet does, so a pre-warmed image is the one the kubelet will find.
``ContentStatusReader`` reads containerd's own content service for the byte offsets of in-flight
downloads, which the CRI does not report: that is the live progress of a pull.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from prewarm_agent.cri.errors import (
    CriError,
    CriUnavailableError,
    ImagePullError,
    PullCancelledError,
    PullStalledError,
    PullTimeoutError,
)
from prewarm_agent.cri.gen import containerd_content_v1_pb2 as content_pb2
from prewarm_agent.cri.gen import containerd_content_v1_pb2_grpc as content_grpc
from prewarm_agent.cri.gen import cri_runtime_v1_pb2 as cri_pb2
from prewarm_agent.cri.gen import cri_runtime_v1_pb2_grpc as cri_grpc

CRI_API_VERSION = "v1"
# The containerd namespace the CRI plugin keeps its images and downloads in.
CRI_NAMESPACE = "k8s.io"
DEFAULT_TIMEOUT = 10.0
# containerd's text when it cancels a pull itself (image_pull_progress_timeout); a cancel of ours never
# reaches containerd's error path, so its status carries no such words.
_RUNTIME_CANCEL = "context canceled"
STALLED_HINT = ("containerd cancelled the pull: no byte progress within its image_pull_progress_timeout; "
                "on containerd 2.1 and later also while a long unpack runs, containerd#13909")
# Nodes with thousands of images answer ListImages with more than gRPC's 4 MiB default.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class RuntimeVersion:
    """What the runtime says it is (``RuntimeService/Version``)."""

    runtime_name: str
    runtime_version: str
    runtime_api_version: str


@dataclass(frozen=True)
class ImageInfo:
    """An image the runtime holds: its id (the config digest), names and unpacked size in bytes;
    ``pinned`` when the runtime keeps it from kubelet's image garbage collection (containerd 1.7.10 and
    later report the ``io.cri-containerd.pinned`` label so; 1.6 never does)."""

    id: str
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    size: int
    pinned: bool = False


@dataclass(frozen=True)
class FsUsage:
    """Bytes and inodes the runtime's images use on one filesystem (``ImageFsInfo``)."""

    mountpoint: str
    used_bytes: int
    inodes_used: int
    timestamp_ns: int

    def usage_percent(self) -> float:
        """Percent in use of the whole filesystem holding ``mountpoint``; see ``filesystem_usage_percent``."""
        return filesystem_usage_percent(self.mountpoint)


@dataclass(frozen=True)
class IngestStatus:
    """One in-flight download in containerd's content store: ``offset`` of ``total`` bytes written."""

    ref: str
    offset: int
    total: int
    expected: str
    started_at: datetime | None
    updated_at: datetime | None


def filesystem_usage_percent(path: str) -> float:
    """Percent of the filesystem holding ``path`` that is in use, computed as ``df`` does.

    The CRI reports only the bytes images take, never the size of the disk, so this asks the kernel
    (``os.statvfs``) about the filesystem that holds ``path``. Space reserved for root counts as
    unavailable. Run inside a pod, ``path`` (the runtime's mountpoint, e.g.
    ``/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs``) must be mounted from the host at
    the same path, or the answer describes the container's own filesystem instead of the node's.
    """
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = used + st.f_bavail * st.f_frsize
    return 100.0 * used / usable if usable else 0.0


def _unix_target(socket_path: str) -> str:
    return f"unix://{os.path.abspath(socket_path)}"


def _open_channel(socket_path: str) -> grpc.Channel:
    return grpc.insecure_channel(
        _unix_target(socket_path),
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ],
    )


def _status_of(err: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    # Errors raised by gRPC calls are also grpc.Call objects carrying the status.
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else None
    return code, details or ""


def _call_error(
    err: grpc.RpcError,
    *,
    socket_path: str,
    action: str,
    timeout: float | None,
    image: str = "",
    pull: bool = False,
    deadline_passed: bool = False,
) -> CriError:
    """The typed error for a failed call; ``pull`` selects the pull-specific kinds.

    ``deadline_passed``: the call's own deadline had passed when it failed. The runtime enforces the
    deadline it was sent too, and when its timer fires before ours it resets the stream (HTTP/2
    RST_STREAM CANCEL), which reaches us as CANCELLED "Stream removed", not DEADLINE_EXCEEDED.
    """
    code, details = _status_of(err)
    code_name = code.name if code is not None else ""
    kind: type[CriError] = ImagePullError if pull else CriError
    message = f"{action} failed ({code_name}): {details}"
    cancelled = code is grpc.StatusCode.CANCELLED
    if code is grpc.StatusCode.UNAVAILABLE:
        kind = CriUnavailableError
        message = f"container runtime socket {socket_path} is unavailable while {action}: {details}"
    elif pull and cancelled and _RUNTIME_CANCEL in details:
        kind, message = PullStalledError, f"{details} ({STALLED_HINT})"
    elif code is grpc.StatusCode.DEADLINE_EXCEEDED or (cancelled and deadline_passed):
        limit = f"{timeout:g}s" if timeout is not None else "its"
        kind = PullTimeoutError if pull else CriUnavailableError
        message = f"{action} did not finish within {limit} deadline ({socket_path}): {details}"
    elif pull and cancelled:
        kind, message = PullCancelledError, f"{action} was cancelled"
    elif pull:
        message = f"{action} failed: {details}"
    return kind(message, code=code_name, details=details, image=image)


def _image_info(image: cri_pb2.Image) -> ImageInfo:
    return ImageInfo(
        id=image.id,
        repo_tags=tuple(image.repo_tags),
        repo_digests=tuple(image.repo_digests),
        size=image.size,
        pinned=image.pinned,
    )


class PullHandle:
    """A pull running in the runtime as an in-flight gRPC call.

    ``cancel()`` cancels the call itself, which makes containerd abandon the download (its HTTP
    connections to the registry close); ``result()`` waits for the image reference.
    """

    def __init__(
        self,
        image: str,
        future: grpc.Future,
        *,
        socket_path: str,
        timeout: float | None,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
    ) -> None:
        self.image = image
        self.timeout = timeout
        self._future = future
        self._socket_path = socket_path
        self._clock = clock
        self._started = clock() if started is None else started  # when the call began: its deadline's start

    def _deadline_passed(self) -> bool:
        return self.timeout is not None and self._clock() - self._started >= self.timeout

    def cancel(self) -> bool:
        """Cancel the pull; returns False when it had already finished."""
        return bool(self._future.cancel())

    def done(self) -> bool:
        """True once the pull succeeded, failed or was cancelled."""
        return bool(self._future.done())

    def cancelled(self) -> bool:
        """True when the pull was cancelled by ``cancel()``."""
        return bool(self._future.cancelled())

    def result(self, timeout: float | None = None) -> str:
        """Wait up to ``timeout`` seconds (None: for ever) and return the pulled image's ``image_ref``.

        Raises ``TimeoutError`` if the pull is still running when the wait ends (the pull goes on),
        ``PullCancelledError``, ``PullTimeoutError`` (its own deadline passed), ``ImagePullError``
        (with the runtime's reason) or ``CriUnavailableError``.
        """
        try:
            response = self._future.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise TimeoutError(f"pull of {self.image} still running after waiting {timeout:g}s") from None
        except grpc.FutureCancelledError:
            raise PullCancelledError(f"pulling {self.image} was cancelled", image=self.image) from None
        except grpc.RpcError as err:
            raise _call_error(
                err,
                socket_path=self._socket_path,
                action=f"pulling {self.image}",
                timeout=self.timeout,
                image=self.image,
                pull=True,
                deadline_passed=self._deadline_passed(),
            ) from err
        return str(response.image_ref)

    def add_done_callback(self, callback: Callable[[PullHandle], None]) -> None:
        """Call ``callback(handle)`` from a gRPC thread when the pull ends (at once if it has)."""
        self._future.add_done_callback(lambda _future: callback(self))


class _SocketClient:
    """A gRPC channel to the runtime's unix socket, closed by `close()` or on leaving a ``with`` block."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel = _open_channel(socket_path)

    def close(self) -> None:
        """Close the channel; calls in flight (pulls too) are cancelled."""
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CriImageClient(_SocketClient):
    """The CRI ImageService (and ``Version``) of the runtime listening on ``socket_path``.

    ``timeout`` bounds every call except pulls, whose deadline is given per pull.
    """

    def __init__(self, socket_path: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(socket_path, timeout)
        self._images = cri_grpc.ImageServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._runtime = cri_grpc.RuntimeServiceStub(self._channel)  # type: ignore[no-untyped-call]

    def _call(self, method: Any, request: Any, action: str, image: str = "") -> Any:
        started = time.monotonic()
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as err:
            raise _call_error(
                err,
                socket_path=self.socket_path,
                action=action,
                timeout=self.timeout,
                image=image,
                deadline_passed=time.monotonic() - started >= self.timeout,
            ) from err

    def version(self) -> RuntimeVersion:
        """Name and version of the runtime; also the cheapest check that it answers."""
        response = self._call(
            self._runtime.Version, cri_pb2.VersionRequest(version=CRI_API_VERSION), "asking its version"
        )
        return RuntimeVersion(
            runtime_name=response.runtime_name,
            runtime_version=response.runtime_version,
            runtime_api_version=response.runtime_api_version,
        )

    def image_status(self, image: str) -> ImageInfo | None:
        """The image as the runtime holds it, or None when it is not present (the IfNotPresent check)."""
        request = cri_pb2.ImageStatusRequest(image=cri_pb2.ImageSpec(image=image))
        response = self._call(self._images.ImageStatus, request, f"checking image {image}", image)
        return _image_info(response.image) if response.HasField("image") else None

    def list_images(self) -> list[ImageInfo]:
        """Every image the runtime holds. No filter is sent: containerd ignores it (1.6 to 2.1)."""
        response = self._call(self._images.ListImages, cri_pb2.ListImagesRequest(), "listing images")
        return [_image_info(image) for image in response.images]

    def image_fs_info(self) -> list[FsUsage]:
        """Usage of each filesystem holding images, as the runtime reports it."""
        response = self._call(self._images.ImageFsInfo, cri_pb2.ImageFsInfoRequest(), "reading image fs info")
        return [
            FsUsage(
                mountpoint=fs.fs_id.mountpoint,
                used_bytes=fs.used_bytes.value,
                inodes_used=fs.inodes_used.value,
                timestamp_ns=fs.timestamp,
            )
            for fs in response.image_filesystems
        ]

    def images_in_use(self) -> set[str]:
        """The images of the node's containers, as CRI `ListContainers` names them (the container's image spec
        and its image ref: an id, a digest or a name), in every state: the kubelet's image garbage collection
        keeps an image any container has, running or not, and so does the agent."""
        response = self._call(self._runtime.ListContainers, cri_pb2.ListContainersRequest(), "listing containers")
        return {name for c in response.containers for name in (c.image.image, c.image_ref) if name}

    def remove_image(self, image: str) -> None:
        """Remove the image; a no-op when absent. containerd removes the image by its id, so every tag of
        it goes (1.6 to 2.1)."""
        request = cri_pb2.RemoveImageRequest(image=cri_pb2.ImageSpec(image=image))
        self._call(self._images.RemoveImage, request, f"removing image {image}", image)

    def pull_image(
        self,
        image: str,
        auth: tuple[str, str] | None = None,
        sandbox_labels: Mapping[str, str] | None = None,
        sandbox_annotations: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> PullHandle:
        """Start pulling ``image`` and return at once; the handle waits for or cancels the pull.

        ``auth`` is a (username, password) pair sent for whichever registry serves the image.
        ``timeout`` is the pull's deadline in seconds (None: no deadline); when it passes the runtime
        stops the download and the handle raises ``PullTimeoutError``.
        """
        request = cri_pb2.PullImageRequest(image=cri_pb2.ImageSpec(image=image))
        if auth is not None:
            username, password = auth
            request.auth.CopyFrom(cri_pb2.AuthConfig(username=username, password=password))
        if sandbox_labels or sandbox_annotations:
            request.sandbox_config.CopyFrom(
                cri_pb2.PodSandboxConfig(labels=sandbox_labels or {}, annotations=sandbox_annotations or {})
            )
        started = time.monotonic()  # gRPC counts the deadline from inside the call below
        future = self._images.PullImage.future(request, timeout=timeout)
        return PullHandle(image, future, socket_path=self.socket_path, timeout=timeout, started=started)


def _timestamp(ts: Timestamp) -> datetime | None:
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    when: datetime = ts.ToDatetime(tzinfo=UTC)
    return when


class ContentStatusReader(_SocketClient):
    """In-flight downloads in containerd's content store (``content.v1`` ``ListStatuses``/``Status``).

    containerd names each download ``<kind>-<digest>`` (e.g. ``layer-sha256:...``); ``offset`` grows
    in steps (containerd 1.6 writes 1 MiB at a time) and the entry disappears once the blob is
    committed or the download is abandoned (pull cancelled or timed out).
    """

    def __init__(
        self, socket_path: str, namespace: str = CRI_NAMESPACE, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        super().__init__(socket_path, timeout)
        self.namespace = namespace
        self._content = content_grpc.ContentStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = (("containerd-namespace", namespace),)

    def list_statuses(self, filters: Sequence[str] = ()) -> list[IngestStatus]:
        """Every in-flight download, or those matching any containerd filter (e.g. ``ref~="layer-"``)."""
        request = content_pb2.ListStatusesRequest(filters=list(filters))
        try:
            response = self._content.ListStatuses(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise _call_error(
                err, socket_path=self.socket_path, action="listing ingest statuses", timeout=self.timeout
            ) from err
        return [self._ingest(status) for status in response.statuses]

    def status(self, ref: str) -> IngestStatus | None:
        """The download named ``ref``, or None when there is none (finished or never started)."""
        try:
            response = self._content.Status(
                content_pb2.StatusRequest(ref=ref), timeout=self.timeout, metadata=self._metadata
            )
        except grpc.RpcError as err:
            code, _ = _status_of(err)
            if code is grpc.StatusCode.NOT_FOUND:
                return None
            raise _call_error(
                err, socket_path=self.socket_path, action=f"reading ingest status {ref}", timeout=self.timeout
            ) from err
        return self._ingest(response.status)

    @staticmethod
    def _ingest(status: content_pb2.Status) -> IngestStatus:
        return IngestStatus(
            ref=status.ref,
            offset=status.offset,
            total=status.total,
            expected=status.expected,
            started_at=_timestamp(status.started_at),
            updated_at=_timestamp(status.updated_at),
        )

"""CriImageClient and ContentStatusReader against an in-process gRPC server on a unix socket:
the mapping of gRPC outcomes to typed errors, and real cancellation of an in-flight pull."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from prewarm_agent.cri.client import ContentStatusReader, CriImageClient, PullHandle, filesystem_usage_percent
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

# What containerd 1.7 and 2.x answer when their image_pull_progress_timeout cancels a pull.
STALLED = 'failed to pull and unpack image "r/stalled:v1": context canceled'
UNAUTHORIZED = (
    'failed to pull and unpack image "r/app:v1": failed to resolve reference "r/app:v1": '
    "pulling from host r failed with status code [manifests v1]: 401 Unauthorized"
)


class ScriptedImageService(cri_grpc.ImageServiceServicer):  # type: ignore[misc, unused-ignore]
    """Answers PullImage by image name: "ok", "denied", or "slow" (blocks until the call ends)."""

    def __init__(self) -> None:
        self.slow_pull_ended = threading.Event()
        self.requests: list[cri_pb2.PullImageRequest] = []

    def PullImage(self, request: cri_pb2.PullImageRequest, context: grpc.ServicerContext) -> cri_pb2.PullImageResponse:
        self.requests.append(request)
        name = request.image.image
        if name == "denied":
            context.abort(grpc.StatusCode.UNKNOWN, UNAUTHORIZED)
        if name == "stalled":
            context.abort(grpc.StatusCode.CANCELLED, STALLED)
        if name == "slow":
            context.add_callback(self.slow_pull_ended.set)
            self.slow_pull_ended.wait(timeout=10)
            context.abort(grpc.StatusCode.CANCELLED, "gone")
        return cri_pb2.PullImageResponse(image_ref="sha256:" + "a" * 64)

    def ImageStatus(
        self, request: cri_pb2.ImageStatusRequest, context: grpc.ServicerContext
    ) -> cri_pb2.ImageStatusResponse:
        if request.image.image == "present":
            image = cri_pb2.Image(id="sha256:" + "b" * 64, repo_tags=["r/present:v1"], size=42)
            return cri_pb2.ImageStatusResponse(image=image)
        return cri_pb2.ImageStatusResponse()


class ScriptedContent(content_grpc.ContentServicer):  # type: ignore[misc, unused-ignore]
    def __init__(self) -> None:
        self.namespaces: list[str] = []

    def ListStatuses(
        self, request: content_pb2.ListStatusesRequest, context: grpc.ServicerContext
    ) -> content_pb2.ListStatusesResponse:
        self.namespaces.append(dict(context.invocation_metadata()).get("containerd-namespace", ""))
        status = content_pb2.Status(ref="layer-sha256:" + "c" * 64, offset=1048576, total=4194304)
        status.started_at.FromSeconds(1_700_000_000)
        status.updated_at.FromSeconds(1_700_000_005)
        return content_pb2.ListStatusesResponse(statuses=[status])

    def Status(self, request: content_pb2.StatusRequest, context: grpc.ServicerContext) -> content_pb2.StatusResponse:
        context.set_code(grpc.StatusCode.NOT_FOUND)
        context.set_details(f"ref {request.ref} not found")
        return content_pb2.StatusResponse()


Runtime = tuple[str, ScriptedImageService, ScriptedContent]


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    socket_path = str(tmp_path / "cri.sock")
    images, content = ScriptedImageService(), ScriptedContent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    cri_grpc.add_ImageServiceServicer_to_server(images, server)  # type: ignore[no-untyped-call, unused-ignore]
    content_grpc.add_ContentServicer_to_server(content, server)  # type: ignore[no-untyped-call, unused-ignore]
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    yield socket_path, images, content
    images.slow_pull_ended.set()
    server.stop(grace=None)


def test_a_missing_socket_is_a_retryable_unavailable_error(tmp_path: Path) -> None:
    # Given no runtime listening
    # When asking its version
    with (
        CriImageClient(str(tmp_path / "absent.sock"), timeout=2) as client,
        pytest.raises(CriUnavailableError) as caught,
    ):
        client.version()

    # Then the error names the socket and says a retry may work
    assert caught.value.retryable
    assert "absent.sock" in str(caught.value)


def test_a_refused_pull_carries_the_runtime_text_verbatim(runtime: Runtime) -> None:
    socket_path, _, _ = runtime
    # When the runtime fails the pull
    with CriImageClient(socket_path) as client, pytest.raises(ImagePullError) as caught:
        client.pull_image("denied").result(timeout=5)

    # Then the reason is there word for word
    assert caught.value.details == UNAUTHORIZED
    assert "401 Unauthorized" in str(caught.value)
    assert caught.value.image == "denied"
    assert not caught.value.retryable


def test_a_pull_the_runtime_cancelled_itself_is_a_retryable_stall_not_a_cancel(runtime: Runtime) -> None:
    socket_path, _, _ = runtime
    # When containerd cancels the pull itself (no progress within its image_pull_progress_timeout)
    with CriImageClient(socket_path) as client, pytest.raises(PullStalledError) as caught:
        client.pull_image("stalled").result(timeout=5)

    # Then it is no cancel of ours: containerd's words, why, and a retry is advised
    assert not isinstance(caught.value, PullCancelledError)
    assert caught.value.details == STALLED and caught.value.code == "CANCELLED"
    assert str(caught.value).startswith(STALLED + " (containerd cancelled the pull: no byte progress within its "
                                        "image_pull_progress_timeout; on containerd 2.1 and later also while "
                                        "a long unpack")
    assert caught.value.retryable


def test_a_pull_sends_credentials_and_sandbox_metadata(runtime: Runtime) -> None:
    socket_path, images, _ = runtime
    with CriImageClient(socket_path) as client:
        # When pulling with credentials and sandbox labels
        image_ref = client.pull_image(
            "ok", auth=("AWS", "token"), sandbox_labels={"app": "prewarm"}, sandbox_annotations={"a": "b"}
        ).result(timeout=5)

    # Then the request carries them and the image ref comes back
    request = images.requests[-1]
    assert image_ref == "sha256:" + "a" * 64
    assert (request.auth.username, request.auth.password) == ("AWS", "token")
    assert dict(request.sandbox_config.labels) == {"app": "prewarm"}
    assert dict(request.sandbox_config.annotations) == {"a": "b"}


def test_a_pull_without_extras_sends_no_auth_or_sandbox(runtime: Runtime) -> None:
    socket_path, images, _ = runtime
    with CriImageClient(socket_path) as client:
        client.pull_image("ok").result(timeout=5)

    request = images.requests[-1]
    assert not request.HasField("auth")
    assert not request.HasField("sandbox_config")


def test_cancel_ends_the_call_on_the_runtime_side(runtime: Runtime) -> None:
    socket_path, images, _ = runtime
    with CriImageClient(socket_path) as client:
        # Given a pull the runtime is still working on
        handle = client.pull_image("slow")
        with pytest.raises(TimeoutError):
            handle.result(timeout=0.2)

        # When it is cancelled
        assert handle.cancel()

        # Then the caller gets PullCancelledError and the runtime sees its call end
        with pytest.raises(PullCancelledError):
            handle.result(timeout=5)
        assert images.slow_pull_ended.wait(timeout=5)
        assert handle.cancelled()


def test_a_pull_past_its_deadline_is_a_timeout(runtime: Runtime) -> None:
    socket_path, images, _ = runtime
    with CriImageClient(socket_path) as client:
        handle = client.pull_image("slow", timeout=0.3)
        with pytest.raises(PullTimeoutError) as caught:
            handle.result(timeout=5)

    assert "0.3s" in str(caught.value)
    assert caught.value.code == "DEADLINE_EXCEEDED"
    assert images.slow_pull_ended.wait(timeout=5)


class _ResetStream(grpc.RpcError):
    """What gRPC raises when the peer resets the stream: CANCELLED, "Stream removed"."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return "Stream removed"


class _FailedFuture:
    def result(self, timeout: float | None = None) -> None:
        raise _ResetStream()


def _reset_pull(*, elapsed: float, timeout: float | None) -> PullHandle:
    ticks = iter([100.0, 100.0 + elapsed])
    return PullHandle(
        "r/app:v1", _FailedFuture(), socket_path="cri.sock", timeout=timeout, clock=lambda: next(ticks)
    )  # type: ignore[arg-type]


def test_a_stream_the_runtime_reset_once_the_deadline_passed_is_a_timeout() -> None:
    # Given a pull whose 1.5 s deadline passed; containerd's timer fired before ours and reset the stream
    handle = _reset_pull(elapsed=1.6, timeout=1.5)

    # Then it is the pull's timeout, not a cancel nobody asked for
    with pytest.raises(PullTimeoutError) as caught:
        handle.result(timeout=5)
    assert "1.5s deadline" in str(caught.value)
    assert caught.value.code == "CANCELLED"


def test_the_deadline_counts_from_when_the_call_began_not_from_when_its_handle_was_made() -> None:
    # The call took 0.2 s to return its future: a reset 1.4 s after the handle is 1.6 s into a 1.5 s deadline
    handle = PullHandle("r/app:v1", _FailedFuture(), socket_path="cri.sock", timeout=1.5,  # type: ignore[arg-type]
                        clock=lambda: 101.6, started=100.0)
    with pytest.raises(PullTimeoutError):
        handle.result(timeout=5)


@pytest.mark.parametrize(("elapsed", "timeout"), [(0.5, 1.5), (30.0, None)])
def test_a_stream_reset_before_the_deadline_stays_a_cancel(elapsed: float, timeout: float | None) -> None:
    with pytest.raises(PullCancelledError):
        _reset_pull(elapsed=elapsed, timeout=timeout).result(timeout=5)


def test_image_status_is_none_for_an_absent_image(runtime: Runtime) -> None:
    socket_path, _, _ = runtime
    with CriImageClient(socket_path) as client:
        present = client.image_status("present")
        absent = client.image_status("absent")

    assert present is not None and present.repo_tags == ("r/present:v1",) and present.size == 42
    assert absent is None


def test_an_unimplemented_call_is_a_plain_cri_error(runtime: Runtime) -> None:
    socket_path, _, _ = runtime
    with CriImageClient(socket_path) as client, pytest.raises(CriError) as caught:
        client.list_images()

    assert caught.value.code == "UNIMPLEMENTED"
    assert not isinstance(caught.value, CriUnavailableError)


def test_ingest_statuses_are_read_in_the_cri_namespace(runtime: Runtime) -> None:
    socket_path, _, content = runtime
    with ContentStatusReader(socket_path) as reader:
        statuses = reader.list_statuses()
        missing = reader.status("layer-sha256:none")

    assert content.namespaces == ["k8s.io"]
    assert [(s.offset, s.total) for s in statuses] == [(1048576, 4194304)]
    assert statuses[0].started_at is not None and statuses[0].started_at.year == 2023
    assert missing is None


def test_filesystem_usage_percent_describes_the_filesystem_of_the_path(tmp_path: Path) -> None:
    percent = filesystem_usage_percent(str(tmp_path))

    assert 0.0 < percent < 100.0

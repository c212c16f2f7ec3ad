"""The pull loop of one task (`TaskRunner`) with a scripted runtime and a clock that never sleeps."""

from __future__ import annotations

import threading

import pytest

from prewarm.domain.registries import RegistryAuth
from prewarm.domain.status import PULL_DEADLINE_EXCEEDED_MESSAGE
from prewarm_agent.attempts import (
    PULLED_BY,
    PULLED_BY_ANNOTATION,
    TaskRunner,
    is_auth_error,
    registry_allowed,
)
from prewarm_agent.cri.client import ImageInfo
from prewarm_agent.cri.errors import CriUnavailableError, ImagePullError
from prewarm_agent.pulls import PullCoordinator, TaskRun
from tests.support.agent import (
    IMAGE_ID,
    NEVER,
    REPO_DIGEST,
    FakeCredentials,
    FakeDisk,
    FakeRuntime,
    RecordedEvents,
    make_run,
    make_task,
)
from tests.support.clock import Clock

IMAGE = "registry.example.com/team/app:v1"
UNAUTHORIZED = (
    f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": pulling from host '
    "registry.example.com failed with status code [manifests v1]: 401 Unauthorized"
)
NOT_FOUND = f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": {IMAGE}: not found'


def pull_error(details: str) -> ImagePullError:
    return ImagePullError(f"pulling {IMAGE} failed: {details}", code="UNKNOWN", details=details, image=IMAGE)


class Setup:
    def __init__(
        self,
        outcomes: list[object] | None = None,
        *,
        credentials: FakeCredentials | None = None,
        disk: FakeDisk | None = None,
        present: dict[str, ImageInfo] | None = None,
        allowlist: tuple[str, ...] = (),
        max_concurrent: int = 2,
    ) -> None:
        self.clock = Clock()
        self.runtime = FakeRuntime(outcomes if outcomes is not None else [IMAGE_ID], present)
        self.credentials = credentials or FakeCredentials()
        self.disk = disk or FakeDisk()
        self.events = RecordedEvents()
        self.pulls = PullCoordinator(max_concurrent, self.clock)
        self.runner = TaskRunner(
            runtime=self.runtime, pulls=self.pulls, credentials=self.credentials, disk=self.disk,
            clock=self.clock, events=self.events, allowlist=allowlist,
        )

    def backoffs(self, run: TaskRun) -> list[float]:
        return self.clock.waits_on(run.cancelled)


# --- one attempt --------------------------------------------------------------------------------


def test_a_successful_pull_reports_pulling_then_succeeded_with_the_image() -> None:
    setup = Setup()
    run = make_run(make_task(IMAGE, sandbox_labels={"team": "api"}, sandbox_annotations={"owner": "ml"}))

    final = setup.runner.run(run)

    (pulling,) = setup.events.reports
    assert (pulling.phase, pulling.attempt, pulling.seq, pulling.started_at) == ("Pulling", 1, 1, setup.clock.started)
    assert (final.phase, final.attempt, final.seq) == ("Succeeded", 1, 2)
    assert (final.job, final.job_uid, final.round, final.node) == ("default/warm", "uid-1", 2, "node-a")
    assert final.image_id == IMAGE_ID
    assert final.repo_digest == f"registry.example.com/team/app@{REPO_DIGEST}"
    assert final.size_bytes == 4096
    assert final.started_at == pulling.started_at and final.finished_at is not None
    (request,) = setup.runtime.pulls
    assert request.image == IMAGE
    assert request.auth is None
    assert request.labels == {"team": "api"}
    assert request.annotations == {"owner": "ml", PULLED_BY_ANNOTATION: PULLED_BY}


def test_if_not_present_succeeds_without_pulling_when_the_image_is_there() -> None:
    info = ImageInfo(id=IMAGE_ID, repo_tags=(IMAGE,), repo_digests=(f"registry.example.com/team/app@{REPO_DIGEST}",),
                     size=77)
    setup = Setup(present={IMAGE: info})

    final = setup.runner.run(make_run(make_task(IMAGE, image_pull_policy="IfNotPresent")))

    assert setup.runtime.pulls == []
    assert setup.events.reports == []
    assert (final.phase, final.attempt, final.size_bytes) == ("Succeeded", 0, 77)
    assert final.message == "image already present"


def test_always_pulls_even_when_the_image_is_there() -> None:
    info = ImageInfo(id="sha256:" + "0" * 64, repo_tags=(IMAGE,), repo_digests=(), size=1)
    setup = Setup(present={IMAGE: info})

    final = setup.runner.run(make_run(make_task(IMAGE, image_pull_policy="Always")))

    assert len(setup.runtime.pulls) == 1
    assert final.image_id == IMAGE_ID


def test_a_reference_without_tag_or_digest_is_pulled_as_latest_and_normalised() -> None:
    setup = Setup()

    setup.runner.run(make_run(make_task("busybox")))

    assert setup.runtime.pulls[0].image == "docker.io/library/busybox:latest"


def test_an_invalid_reference_fails_without_a_pull() -> None:
    setup = Setup()

    final = setup.runner.run(make_run(make_task("Busybox:1")))

    assert final.phase == "Failed"
    assert final.message == 'invalid image reference "Busybox:1": repository name must be lowercase'
    assert setup.runtime.pulls == []


# --- retries ------------------------------------------------------------------------------------


def test_failed_attempts_back_off_one_two_four_seconds_then_fail_with_the_last_error_verbatim() -> None:
    # Given four attempts that all fail
    setup = Setup([pull_error("first"), pull_error("second"), pull_error("third"), pull_error(NOT_FOUND)])
    run = make_run(make_task(IMAGE, backoff_limit=3))

    final = setup.runner.run(run)

    # Then Kruise's sleeps came between attempts (none after the last) and the runtime's text is reported
    assert setup.backoffs(run) == [1.0, 2.0, 4.0]
    assert [r.attempt for r in setup.events.reports] == [1, 2, 3, 4]
    assert (final.phase, final.attempt, final.message) == ("Failed", 4, NOT_FOUND)
    assert len(setup.runtime.pulls) == 4


def test_succeeded_carries_the_manifests_byte_total() -> None:
    setup = Setup()
    setup.events.layers = {"sha256:" + "1" * 64: 300, "sha256:" + "2" * 64: 700}

    final = setup.runner.run(make_run(make_task(IMAGE)))

    assert (final.bytes_done, final.bytes_total) == (1000, 1000)


def test_a_retry_that_succeeds_reports_its_attempt_and_keeps_the_first_start() -> None:
    setup = Setup([pull_error("flaky"), IMAGE_ID])
    run = make_run(make_task(IMAGE, backoff_limit=3))

    final = setup.runner.run(run)

    assert (final.phase, final.attempt) == ("Succeeded", 2)
    assert final.started_at == setup.events.reports[0].started_at
    assert setup.events.reports[1].seq > setup.events.reports[0].seq


def test_backoff_doubles_up_to_thirty_seconds() -> None:
    setup = Setup([pull_error(f"try {n}") for n in range(8)])
    run = make_run(make_task(IMAGE, backoff_limit=7))

    setup.runner.run(run)

    assert setup.backoffs(run) == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_an_attempt_that_outlives_its_timeout_is_cancelled_and_retried() -> None:
    # Given a first pull that never ends and a timeout of 5 s
    setup = Setup([NEVER, IMAGE_ID])
    run = make_run(make_task(IMAGE, timeout_seconds=5, backoff_limit=1))

    final = setup.runner.run(run)

    # Then the first call was cancelled at 5 s and the second attempt succeeded
    first, second = setup.runtime.pulls
    assert first.call.cancelled and not second.call.cancelled
    assert (final.phase, final.attempt) == ("Succeeded", 2)
    assert setup.clock.monotonic() == pytest.approx(5 + 1)


def test_the_last_timeout_is_reported() -> None:
    setup = Setup([NEVER])
    run = make_run(make_task(IMAGE, timeout_seconds=7, backoff_limit=0))

    final = setup.runner.run(run)

    assert (final.phase, final.attempt) == ("Failed", 1)
    assert final.message == f"pulling image {IMAGE} timed out after 7s"
    assert setup.runtime.pulls[0].call.cancelled


def test_the_deadline_cuts_the_attempt_and_no_attempt_starts_after_it() -> None:
    # Given a deadline 12 s away, 10 s attempts and many retries
    setup = Setup([NEVER, NEVER, NEVER])
    run = make_run(make_task(IMAGE, timeout_seconds=10, backoff_limit=5, deadline=Clock().now + 12))

    final = setup.runner.run(run)

    # Then attempt 1 ran 10 s, slept 1 s, attempt 2 was cut to the 1 s left, and no third began
    assert len(setup.runtime.pulls) == 2
    assert setup.clock.monotonic() == pytest.approx(12)
    assert final.phase == "Failed"
    assert final.message == f"{PULL_DEADLINE_EXCEEDED_MESSAGE}; last error: pulling image {IMAGE} timed out after 1s"


def test_a_task_past_its_deadline_fails_without_pulling() -> None:
    setup = Setup()

    final = setup.runner.run(make_run(make_task(IMAGE, deadline=Clock().now - 1)))

    assert (final.phase, final.message, final.attempt) == ("Failed", PULL_DEADLINE_EXCEEDED_MESSAGE, 0)
    assert setup.runtime.pulls == []


def test_cancel_during_the_backoff_ends_the_task_without_another_attempt() -> None:
    setup = Setup([pull_error("first"), IMAGE_ID])
    run = make_run(make_task(IMAGE, backoff_limit=3))

    def cancel_in_backoff(event: threading.Event, timeout: float) -> None:
        if event is run.cancelled:
            run.cancel("job deleted")

    setup.clock.on_wait = cancel_in_backoff

    final = setup.runner.run(run)

    assert (final.phase, final.message, final.attempt) == ("Cancelled", "job deleted", 1)
    assert len(setup.runtime.pulls) == 1


def test_cancel_while_pulling_cancels_the_call() -> None:
    setup = Setup([NEVER])
    run = make_run(make_task(IMAGE))
    setup.clock.on_wait = lambda event, timeout: run.cancel("job deleted") if event is run.wake else None

    final = setup.runner.run(run)

    assert final.phase == "Cancelled"
    assert setup.runtime.pulls[0].call.cancelled


def test_unavailable_runtime_errors_are_reported_with_the_socket() -> None:
    error = CriUnavailableError("container runtime socket /run/containerd/containerd.sock is unavailable while "
                                "pulling: connection refused", code="UNAVAILABLE")
    setup = Setup([error])

    final = setup.runner.run(make_run(make_task(IMAGE, backoff_limit=0)))

    assert final.message == str(error)


# --- credentials --------------------------------------------------------------------------------


def test_a_refused_credential_moves_on_to_the_next_within_the_same_attempt() -> None:
    stale = RegistryAuth("ci", "stale", "registry.example.com/team")
    good = RegistryAuth("ci", "fresh", "registry.example.com")
    setup = Setup([pull_error(UNAUTHORIZED), IMAGE_ID], credentials=FakeCredentials([stale, good]))

    final = setup.runner.run(make_run(make_task(IMAGE, backoff_limit=0)))

    assert [p.auth for p in setup.runtime.pulls] == [("ci", "stale"), ("ci", "fresh")]
    assert (final.phase, final.attempt) == ("Succeeded", 1)
    assert len(setup.events.reports) == 1


def test_an_error_that_is_not_about_credentials_does_not_try_the_next_one() -> None:
    auths = [RegistryAuth("a", "1", "registry.example.com"), RegistryAuth("b", "2", "registry.example.com")]
    setup = Setup([pull_error(NOT_FOUND)], credentials=FakeCredentials(auths))

    final = setup.runner.run(make_run(make_task(IMAGE, backoff_limit=0)))

    assert len(setup.runtime.pulls) == 1
    assert final.message == NOT_FOUND


def test_when_every_credential_is_refused_the_last_refusal_is_reported_with_the_unreadable_secrets() -> None:
    auths = [RegistryAuth("a", "1", "registry.example.com")]
    problem = "secret arn:aws:secretsmanager:us-west-2:1:secret:x does not exist (or is being deleted)"
    setup = Setup([pull_error(UNAUTHORIZED)], credentials=FakeCredentials(auths, [problem]))

    final = setup.runner.run(make_run(make_task(IMAGE, backoff_limit=0, pull_secret_arns=["arn:x"])))

    assert final.message == f"{UNAUTHORIZED} ({problem})"
    assert setup.credentials.asked == [(IMAGE, ("arn:x",))]


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        (UNAUTHORIZED, True),
        ("failed to authorize: failed to fetch oauth token: unexpected status: 403 Forbidden", True),
        ("pull access denied, repository does not exist or may require authorization", True),
        ("denied: Your authorization token has expired. Reauthenticate and try again.", True),
        (NOT_FOUND, False),
        ("no match for platform in manifest: not found", False),
        ("failed to copy: httpReadSeeker: failed open: unexpected status code 500", False),
    ],
)
def test_registry_refusals_are_recognised(text: str, refused: bool) -> None:
    assert is_auth_error(text) is refused


# --- node protection ----------------------------------------------------------------------------


def test_a_disk_guard_refusal_fails_at_once_without_a_pull_or_retry() -> None:
    refusal = "disk guard: imagefs 91% used, threshold 85%"
    setup = Setup(disk=FakeDisk(refusal))
    run = make_run(make_task(IMAGE, backoff_limit=3, size_bytes=1234))

    final = setup.runner.run(run)

    assert (final.phase, final.message) == ("Failed", refusal)
    assert setup.runtime.pulls == []
    assert setup.backoffs(run) == []
    assert setup.disk.checked == [1234]
    assert setup.events.refused == 1


def test_a_registry_outside_the_allowlist_is_refused() -> None:
    setup = Setup(allowlist=("*.dkr.ecr.*.amazonaws.com",))

    final = setup.runner.run(make_run(make_task(IMAGE)))

    assert final.message == "registry registry.example.com is not in the agent's allowlist"
    assert setup.runtime.pulls == []


@pytest.mark.parametrize(
    ("host", "allowlist", "allowed"),
    [
        ("registry.example.com", (), True),
        ("123456789012.dkr.ecr.us-west-2.amazonaws.com", ("*.dkr.ecr.*.amazonaws.com",), True),
        ("docker.io", ("*.dkr.ecr.*.amazonaws.com",), False),
        ("127.0.0.1:5000", ("127.0.0.1:*",), True),
        ("127.0.0.1:5000", ("127.0.0.1",), False),
        ("Registry.Example.com", ("registry.example.com",), True),
    ],
)
def test_allowlist_globs_match_the_host_and_port(host: str, allowlist: tuple[str, ...], allowed: bool) -> None:
    assert registry_allowed(host, allowlist) is allowed


def test_a_reference_with_tag_and_digest_is_pulled_by_its_digest_as_the_control_plane_names_it() -> None:
    setup = Setup()
    digest = "sha256:" + "e" * 64

    setup.runner.run(make_run(make_task(f"busybox:1@{digest}")))

    assert setup.runtime.pulls[0].image == f"docker.io/library/busybox@{digest}"


# --- a registry's 429 -------------------------------------------------------------------------------

THROTTLED = (
    f'failed to pull and unpack image "{IMAGE}": failed to copy: httpReadSeeker: failed open: unexpected status '
    "code https://registry.example.com/v2/team/app/blobs/sha256:ab: 429 Too Many Requests - Server message: "
    "toomanyrequests: Rate exceeded"
)


def test_a_throttled_attempt_is_retried_without_counting_toward_the_backoff_limit() -> None:
    setup = Setup([pull_error(THROTTLED), pull_error(THROTTLED), pull_error(THROTTLED), IMAGE_ID])
    run = make_run(make_task(IMAGE, backoff_limit=0))

    final = setup.runner.run(run)

    assert (final.phase, final.attempt) == ("Succeeded", 1)
    assert len(setup.runtime.pulls) == 4
    throttled = [r for r in setup.events.reports if r.message.startswith("throttled by the registry")]
    assert len(throttled) == 3 and all(r.phase == "Pulling" and r.attempt == 1 for r in throttled)
    assert "not counted toward backoffLimit" in throttled[0].message and "429 Too Many Requests" in throttled[0].message
    waits = setup.backoffs(run)
    # Jittered, doubling: between half and all of 1 s, 2 s, 4 s.
    assert [0.5 <= waits[0] <= 1, 1 <= waits[1] <= 2, 2 <= waits[2] <= 4] == [True, True, True]
    assert run.throttled == ""


def test_throttling_counts_as_a_failed_attempt_once_its_waits_pass_the_timeout() -> None:
    setup = Setup([pull_error(THROTTLED)] * 20)
    run = make_run(make_task(IMAGE, backoff_limit=0, timeout_seconds=5))

    final = setup.runner.run(run)

    assert final.phase == "Failed" and "429 Too Many Requests" in final.message
    assert sum(w for w in setup.backoffs(run)) >= 5
    assert len(setup.runtime.pulls) < 10


def test_a_cancel_during_a_throttled_wait_cancels_the_run() -> None:
    setup = Setup([pull_error(THROTTLED), IMAGE_ID])
    run = make_run(make_task(IMAGE))
    setup.clock.on_wait = lambda event, seconds: run.cancel("job deleted") if event is run.cancelled else None

    final = setup.runner.run(run)

    assert (final.phase, final.message) == ("Cancelled", "job deleted")

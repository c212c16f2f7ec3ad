"""One task, from its checks to its final report: Kruise's pull loop over the CRI.

Checks first (image reference, registry allowlist, `IfNotPresent` against ImageStatus), then up to
`backoff_limit + 1` attempts. Each attempt checks the disk, then tries each matching credential in
turn (a registry refusal moves to the next, and after the last to the node's other credential, see
`credentials`) within `timeout_seconds`, cut to the task's `deadline`.
Failed attempts sleep 1 s doubling to 30 s; a cancel interrupts any wait and cancels the pull.
A registry's 429 (`TOOMANYREQUESTS`) is not the node's failure: the attempt is tried again after a
jittered backoff without counting toward `backoff_limit`, reported as throttled, for up to
`timeout_seconds` of such waits in all (then it counts). containerd does not pass a `Retry-After` on
(its 429 error text holds no header: docs/agent.md, "Pulls"), so the backoff is the agent's own.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from prewarm.domain.images import ImageRef, InvalidImageReference, parse_image
from prewarm.domain.messages import ALREADY_PRESENT, NodePhase, StatusReport
from prewarm.domain.registries import RegistryAuth
from prewarm.domain.registry_budget import THROTTLED_MESSAGE, is_throttled, throttle_backoff
from prewarm.domain.status import PULL_DEADLINE_EXCEEDED_MESSAGE, Attempt, RetryPolicy
from prewarm_agent.clock import Clock
from prewarm_agent.credentials import FALLBACK_ERRORS, Candidates, Fallback, credential_identity
from prewarm_agent.cri.client import ImageInfo
from prewarm_agent.cri.errors import CriError, ImagePullError, PullCancelledError
from prewarm_agent.pulls import ImageRuntime, PullCall, PullCoordinator, SharedPull, TaskRun

log = logging.getLogger(__name__)

PULLED_BY_ANNOTATION = "prewarm.dev/pulled-by"
PULLED_BY = "prewarm-agent"
LAYERS_WAIT_SECONDS = 2.0
# Starts the message of a pull that a `pullSecretsOnly` task's secrets could not do.
OWN_SECRETS_ONLY = "pullSecretsOnly"
# How a registry's refusal of credentials reads in containerd's pull errors.
_AUTH_ERROR = re.compile(r"\b40[13]\b|unauthori[sz]ed|forbidden|denied|authorization failed", re.IGNORECASE)


def is_auth_error(text: str) -> bool:
    """Whether a pull error says the registry refused the credentials (401/403 and their words)."""
    return bool(_AUTH_ERROR.search(text))


def registry_allowed(host: str, allowlist: Sequence[str]) -> bool:
    """Whether registry `host` (with its port, if any) matches one of the allowlist's globs."""
    return not allowlist or any(fnmatch.fnmatchcase(host.lower(), glob) for glob in allowlist)


def error_text(error: CriError) -> str:
    """The runtime's own words for a failed pull, verbatim; our description for other failures."""
    if isinstance(error, ImagePullError) and error.details:
        return str(error.details)
    return str(error)


class CredentialSource(Protocol):
    def candidates(self, image: ImageRef, pull_secret_arns: Sequence[str], *, shared: bool = True) -> Candidates: ...


class DiskCheck(Protocol):
    def check(self, size_bytes: int | None) -> str | None: ...


@dataclass(frozen=True)
class _Pulled:
    image_ref: str
    shared: SharedPull


@dataclass(frozen=True)
class _Failed:
    message: str
    final: bool = False
    #: No pull slot came free in time: no other credential is worth trying.
    no_slot: bool = False


class _Cancelled:
    pass


_CANCELLED = _Cancelled()
_Outcome = _Pulled | _Failed | _Cancelled


class PullEvents(Protocol):
    """What the runner tells the agent about (reports to send, metrics to count)."""

    def attempt_started(self, run: TaskRun, report: StatusReport) -> None: ...

    def pull_started(self, shared: SharedPull, auth: RegistryAuth | None) -> None:
        """A new PullImage call started (not a joined one)."""
        ...

    def disk_refused(self, run: TaskRun) -> None: ...

    def throttled(self, run: TaskRun, report: StatusReport) -> None:
        """The registry refused the run's pull with a 429: the report says it waits (Pulling)."""
        ...


class _Starter:
    """Starts the CRI pull for a run when the coordinator asks; remembers whether it did."""

    def __init__(self, runtime: ImageRuntime, run: TaskRun, reference: str, auth: tuple[str, str] | None) -> None:
        self.runtime = runtime
        self.run = run
        self.reference = reference
        self.auth = auth
        self.started = False

    def __call__(self) -> PullCall:
        task = self.run.task
        self.started = True
        # No gRPC deadline: each waiting run keeps its own, and the call is cancelled when all leave.
        return self.runtime.pull_image(
            self.reference,
            auth=self.auth,
            sandbox_labels=task.sandbox_labels,
            sandbox_annotations={**task.sandbox_annotations, PULLED_BY_ANNOTATION: PULLED_BY},
        )


class _Pulling:
    """One attempt's pulls, one credential at a time: the attempt's clock starts with its first pull."""

    def __init__(self, runner: TaskRunner, run: TaskRun, reference: str, attempt: Attempt) -> None:
        self.runner = runner
        self.run = run
        self.reference = reference
        self.attempt = attempt
        self.ends: float | None = None

    def pull(self, auth: RegistryAuth | None) -> _Outcome:
        runner, run = self.runner, self.run
        not_after = self.ends if self.ends is not None else runner._deadline_monotonic(run)
        pair = (auth.username, auth.password) if auth is not None else None
        starter = _Starter(runner.runtime, run, self.reference, pair)
        shared = runner.pulls.join(run, (self.reference, credential_identity(auth)), starter, not_after=not_after)
        if shared is None:
            if run.cancelled.is_set() or runner.pulls.closed:
                return _CANCELLED
            return _Failed(f"no pull slot free before the deadline ({runner.pulls.max_concurrent} pulls running)",
                           no_slot=True)
        if self.ends is None:
            self.ends = runner.clock.monotonic() + self.attempt.timeout_seconds
            run.begin_attempt(self.attempt.number, runner.clock.time())
            runner.events.attempt_started(run, run.report(NodePhase.PULLING))
        if starter.started:
            runner.events.pull_started(shared, auth)
        return runner._wait(run, shared, self.ends, self.attempt)


class TaskRunner:
    """Runs one `TaskRun` to its final `StatusReport` (Succeeded, Failed or Cancelled)."""

    def __init__(
        self,
        *,
        runtime: ImageRuntime,
        pulls: PullCoordinator,
        credentials: CredentialSource,
        disk: DiskCheck,
        clock: Clock,
        events: PullEvents,
        allowlist: Sequence[str] = (),
    ) -> None:
        self.runtime = runtime
        self.pulls = pulls
        self.credentials = credentials
        self.disk = disk
        self.clock = clock
        self.events = events
        self.allowlist = tuple(allowlist)

    def run(self, run: TaskRun) -> StatusReport:
        """Check, pull with retries, and return the final report (not sent: the caller sends it)."""
        task = run.task
        try:
            image = parse_image(task.image)
        except InvalidImageReference as e:
            return self._final(run, NodePhase.FAILED, message=str(e))
        if not registry_allowed(image.registry, self.allowlist):
            message = f"registry {image.registry} is not in the agent's allowlist"
            return self._final(run, NodePhase.FAILED, message=message)
        # The domain's rule, the control plane's too: by digest when pinned, else the tag (`:latest` added).
        reference = image.pull_reference
        # A pullSecretsOnly task always asks the registry with its secrets, as the kubelet's AlwaysVerify
        # does: an image already here (pulled for another job) proves nothing about them. Layers present
        # are not downloaded again.
        if task.image_pull_policy == "IfNotPresent" and not task.pull_secrets_only:
            present = self._status(reference)
            if present is not None:
                return self._succeeded(run, image, present, None)
        return self._attempts(run, image, reference)

    def _attempts(self, run: TaskRun, image: ImageRef, reference: str) -> StatusReport:
        task = run.task
        policy = RetryPolicy(backoff_limit=task.backoff_limit, timeout_seconds=float(task.timeout_seconds))
        last_error = ""
        number = 1
        throttles, throttled_for = 0, 0.0
        while True:
            if run.cancelled.is_set():
                return self._cancelled(run)
            attempt = policy.attempt(number, self._deadline_remaining(run))
            if attempt is None:
                message = PULL_DEADLINE_EXCEEDED_MESSAGE + (f"; last error: {last_error}" if last_error else "")
                return self._final(run, NodePhase.FAILED, message=message)
            outcome = self._attempt(run, image, reference, attempt)
            if isinstance(outcome, _Pulled):
                return self._succeeded(run, image, self._status(reference), outcome)
            if isinstance(outcome, _Cancelled):
                return self._cancelled(run)
            last_error = run.last_error = outcome.message
            if not outcome.final and is_throttled(outcome.message) and throttled_for < policy.timeout_seconds:
                throttles += 1
                wait = throttle_backoff(throttles)
                throttled_for += wait
                if self._wait_throttled(run, wait, outcome.message):
                    return self._cancelled(run)
                run.throttled = ""
                continue
            throttles = 0
            if outcome.final or number >= policy.max_attempts:
                return self._final(run, NodePhase.FAILED, message=last_error)
            log.info(
                "attempt %d of %d failed, retrying in %gs: %s", number, policy.max_attempts,
                attempt.backoff_seconds, last_error, extra=_context(run),
            )
            remaining = self._deadline_remaining(run)
            backoff = attempt.backoff_seconds if remaining is None else min(attempt.backoff_seconds, remaining)
            if self.clock.wait(run.cancelled, max(0.0, backoff)):
                return self._cancelled(run)
            number += 1

    def _wait_throttled(self, run: TaskRun, wait: float, error: str) -> bool:
        """Waits out a registry's 429 (reported Pulling, throttled); True when cancelled meanwhile."""
        remaining = self._deadline_remaining(run)
        wait = wait if remaining is None else max(0.0, min(wait, remaining))
        run.throttled = (f"{THROTTLED_MESSAGE}, retrying in {wait:.0f}s "
                         f"(not counted toward backoffLimit): {error}")[:1000]
        log.info("attempt %d throttled by the registry, retrying in %.1fs", run.attempt, wait, extra=_context(run))
        self.events.throttled(run, run.report(NodePhase.PULLING, message=run.throttled))
        return self.clock.wait(run.cancelled, wait)

    def _attempt(self, run: TaskRun, image: ImageRef, reference: str, attempt: Attempt) -> _Outcome:
        task = run.task
        refusal = self.disk.check(task.size_bytes)
        if refusal is not None:
            self.events.disk_refused(run)
            log.warning("%s; not pulling", refusal, extra=_context(run))
            return _Failed(refusal, final=True)
        only_secrets = task.pull_secrets_only
        candidates = self.credentials.candidates(image, task.pull_secret_arns, shared=not only_secrets)
        if not candidates.auths:
            unread = f" ({'; '.join(candidates.problems)})" if candidates.problems else ""
            # Unreadable secrets may read next time; secrets that hold nothing for the registry will not.
            return _Failed(f"{OWN_SECRETS_ONLY}: none of the job's pull secrets holds credentials for "
                           f"{image.registry}{unread}", final=not candidates.problems)
        pulling = _Pulling(self, run, reference, attempt)
        failure = _Failed("no credentials to try")
        refused: list[str] = []
        for index, auth in enumerate(candidates.auths):
            outcome = pulling.pull(auth)
            if not isinstance(outcome, _Failed) or outcome.no_slot:
                return outcome
            failure = outcome
            if not is_auth_error(outcome.message):
                break
            if holder := candidates.holders.get(credential_identity(auth)):
                refused.append(holder)
            if index + 1 < len(candidates.auths):
                log.info(
                    "registry refused credential %d of %d, trying the next", index + 1, len(candidates.auths),
                    extra=_context(run),
                )
        else:
            if candidates.fallback is not None and is_auth_error(failure.message):
                outcome = self._fall_back(run, pulling, candidates.fallback, refused, failure)
                if not isinstance(outcome, _Failed) or outcome.no_slot:
                    return outcome
                failure = outcome
        if only_secrets and is_auth_error(failure.message):
            failure = _Failed(f"{failure.message} ({OWN_SECRETS_ONLY}: the registry refused the job's pull secrets, "
                              "and shared credentials are not tried)", failure.final)
        if candidates.problems:
            return _Failed(f"{failure.message} ({'; '.join(candidates.problems)})", failure.final)
        return failure

    def _fall_back(self, run: TaskRun, pulling: _Pulling, fallback: Fallback, refused: list[str],
                   failure: _Failed) -> _Outcome:
        """The pull with the node's other credential once the registry refused the first: a token carries
        its principal's permissions, and the other's may pull what the first's may not."""
        who = " and ".join(refused) or "the node's credential"
        try:
            auth, holder = fallback.get()
        except FALLBACK_ERRORS as e:
            log.warning("the registry refused %s for %s, and %s is not available: %s", who, run.task.image,
                        fallback.holder, e, extra=_context(run))
            return _Failed(f"{failure.message} (the registry refused {who}; {fallback.holder} is not available: {e})",
                           failure.final)
        log.warning("the registry refused %s for %s; pulling with %s instead", who, run.task.image, holder,
                    extra=_context(run))
        outcome = pulling.pull(auth)
        if isinstance(outcome, _Failed) and not outcome.no_slot and is_auth_error(outcome.message):
            return _Failed(f"{outcome.message} (the registry refused {who} and {holder})", outcome.final)
        return outcome

    def _wait(self, run: TaskRun, shared: SharedPull, ends: float, attempt: Attempt) -> _Outcome:
        while True:
            run.wake.clear()
            if shared.call.done():
                self.pulls.leave(shared, run)
                return self._result(run, shared)
            if run.cancelled.is_set():
                self.pulls.leave(shared, run)
                return _CANCELLED
            remaining = ends - self.clock.monotonic()
            if remaining <= 0:
                self.pulls.leave(shared, run)
                return _Failed(f"pulling image {shared.reference} timed out after {attempt.timeout_seconds:g}s")
            self.clock.wait(run.wake, min(remaining, 1.0))

    def _result(self, run: TaskRun, shared: SharedPull) -> _Outcome:
        try:
            return _Pulled(shared.call.result(timeout=0), shared)
        except PullCancelledError:
            # Another run cannot cancel a call this run waits on; only the agent stopping does.
            return _CANCELLED if run.cancelled.is_set() else _Failed(f"pulling image {shared.reference} was cancelled")
        except CriError as e:
            return _Failed(error_text(e))

    def _status(self, reference: str) -> ImageInfo | None:
        try:
            return self.runtime.image_status(reference)
        except CriError as e:
            log.warning("ImageStatus of %s failed, treating the image as absent: %s", reference, e)
            return None

    def _deadline_remaining(self, run: TaskRun) -> float | None:
        deadline = run.task.deadline
        return None if deadline is None else deadline - self.clock.time()

    def _deadline_monotonic(self, run: TaskRun) -> float | None:
        remaining = self._deadline_remaining(run)
        return None if remaining is None else self.clock.monotonic() + remaining

    def _succeeded(self, run: TaskRun, image: ImageRef, info: ImageInfo | None, pulled: _Pulled | None
                   ) -> StatusReport:
        fields: dict[str, object] = {}
        if pulled is not None:
            fields["image_id"] = pulled.image_ref
            # A fast pull can end before its manifest was read; the byte total is worth a short wait.
            self.clock.wait(pulled.shared.layers_resolved, LAYERS_WAIT_SECONDS)
            progress = pulled.shared.finished()
            if progress is not None:
                fields.update(bytes_done=progress.bytes_done, bytes_total=progress.bytes_total)
        if info is not None:
            fields["image_id"] = info.id
            fields["size_bytes"] = info.size
            prefix = f"{image.name}@"
            fields["repo_digest"] = next((d for d in info.repo_digests if d.startswith(prefix)),
                                         info.repo_digests[0] if info.repo_digests else None)
        message = ALREADY_PRESENT if pulled is None else ""
        return self._final(run, NodePhase.SUCCEEDED, message=message, **fields)

    def _cancelled(self, run: TaskRun) -> StatusReport:
        return self._final(run, NodePhase.CANCELLED, message=run.cancel_reason or "cancelled")

    def _final(self, run: TaskRun, phase: NodePhase, **fields: object) -> StatusReport:
        now = self.clock.time()
        return run.report(phase, finished_at=now, started_at=run.started_at or now, **fields)


def _context(run: TaskRun) -> dict[str, object]:
    return {"job": run.task.job, "image": run.task.image, "round": run.task.round}

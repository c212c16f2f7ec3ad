"""Typed errors for calls to the container runtime over the CRI and containerd's API."""

from __future__ import annotations


class CriError(Exception):
    """A call to the container runtime failed.

    ``code`` is the gRPC status code name (``"NOT_FOUND"``, ``"UNKNOWN"``, ...) or ``""`` when the
    call never got an answer; ``details`` is the runtime's own error text, verbatim; ``image`` is the
    image reference the call was about, when there was one.
    """

    retryable = False

    def __init__(self, message: str, *, code: str = "", details: str = "", image: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details
        self.image = image


class CriUnavailableError(CriError):
    """The runtime socket is down or did not answer in time; retry once containerd is back."""

    retryable = True


class ImagePullError(CriError):
    """The runtime refused or failed the pull; ``details`` carries its reason (401, not found, platform)."""


class PullCancelledError(CriError):
    """The pull was cancelled by its caller before it finished."""


class PullStalledError(CriError):
    """containerd cancelled the pull itself: no byte progress within its ``image_pull_progress_timeout``
    (1.7 and later). On 2.1 and later, pulling through the transfer service, this also ends pulls whose
    downloads are done but whose unpack runs long (containerd#13909); a retry finds the layers downloaded.
    The message is containerd's text with that explanation."""

    retryable = True


class PullTimeoutError(CriError):
    """The pull did not finish within its deadline; the runtime was told to stop it."""

    retryable = True

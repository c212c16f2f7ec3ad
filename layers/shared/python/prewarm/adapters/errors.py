"""Errors of the Kubernetes cluster port, free of any client library so services can catch them.

`prewarm.adapters.kube` raises these from the Kubernetes API's responses (HTTP status and the
`Status` body's `reason` and `message`); `prewarm.adapters.eks_auth` from EKS and STS failures.
"""

from __future__ import annotations


class ClusterError(RuntimeError):
    """A call to the Kubernetes API failed.

    `status` is the HTTP status (None when no response arrived), `reason` the `Status` reason
    (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, ...). `retryable` says whether the same call
    may succeed later unchanged.
    """

    retryable = False

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason


class ClusterConfigError(ClusterError):
    """The cluster connection is configured wrongly (endpoint, CA data, kubeconfig, cluster name)."""


class ClusterUnavailableError(ClusterError):
    """The API could not answer now: connection refused or reset, timeout, 429 or 5xx. Retry later.

    `retry_after` is the server's hint in seconds (`Retry-After` or the Status `retryAfterSeconds`).
    """

    retryable = True

    def __init__(
        self, message: str, *, status: int | None = None, reason: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(message, status=status, reason=reason)
        self.retry_after = retry_after


class ClusterAuthError(ClusterError):
    """The API refused the caller (401 or 403): the role lacks an EKS access entry or RBAC rights."""


class ClusterNotFoundError(ClusterError):
    """The object or its namespace does not exist (404)."""


class ClusterConflictError(ClusterError):
    """The write conflicts (409): `reason` is `AlreadyExists`, or `Conflict` for a stale resourceVersion."""


class ClusterInvalidError(ClusterError):
    """The API rejected the request body or parameters (400 or 422); the message is the server's."""


class ClusterExpiredError(ClusterError):
    """The resource version or `continue` token is too old (410 Gone); restart the listing."""

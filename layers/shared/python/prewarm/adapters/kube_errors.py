"""How the Kubernetes API's failures read: one line a person can act on, typed by what can be done.

urllib3's own text names connection pools and objects at memory addresses; an API server's `Status`
message may span lines. Every `ClusterError` the Kubernetes adapter raises is written here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from prewarm.services.ports import (
    ClusterAuthError,
    ClusterConfigError,
    ClusterConflictError,
    ClusterError,
    ClusterExpiredError,
    ClusterInvalidError,
    ClusterNotFoundError,
    ClusterUnavailableError,
)


def unreachable_reason(error: BaseException, timeout: tuple[float, float]) -> str:
    """Why a request got no answer, in a few words (urllib3's text names pools and objects at addresses)."""
    import urllib3.exceptions as u

    reason = getattr(error, "reason", None) or error
    cause = reason.__cause__ or reason.__context__
    if isinstance(reason, u.NameResolutionError):
        return "its host name does not resolve"
    if isinstance(reason, u.NewConnectionError):
        # NewConnectionError is a ConnectTimeoutError too: the OSError under it says which.
        if isinstance(cause, TimeoutError) or "timed out" in str(reason):
            return f"no connection within {timeout[0]:g} s"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror[:1].lower() + cause.strerror[1:]
        return "no connection"
    if isinstance(reason, u.ConnectTimeoutError):
        return f"no connection within {timeout[0]:g} s"
    if isinstance(reason, u.ReadTimeoutError | TimeoutError):
        return f"no answer within {timeout[1]:g} s"
    if isinstance(reason, u.ProtocolError):
        return "the connection was closed before an answer"
    return one_line(str(reason))


# A Python object's repr at an address, and urllib3's pool or connection prefix: nothing a person can use.
_NOISE = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>:?\s*|\b\w+\(host='[^']*', port=\d+\):\s*")


def one_line(text: str, most: int = 200) -> str:
    """`text` on one line, without object addresses, at most `most` characters."""
    flat = " ".join(_NOISE.sub("", text).split())
    return flat if len(flat) <= most else flat[: most - 1] + "…"


def tls_error(host: str, what: str, error: Any) -> ClusterError:
    detail = one_line(str(getattr(error, "reason", "") or error))
    if "CERTIFICATE_VERIFY_FAILED" in detail or "hostname" in detail.lower():
        return ClusterConfigError(
            f"TLS verification of {host} failed on {what}: {detail}; check the CA data (KUBE_CA_DATA)"
        )
    return ClusterUnavailableError(f"TLS connection to {host} failed on {what}: {detail}")


def status_error(status: int, data: bytes, headers: Mapping[str, str], what: str) -> ClusterError:
    """The error type for an HTTP error, with the reason and message of the API's `Status` body."""
    reason, message, retry_after = "", "", None
    try:
        body = json.loads(data) if data else None
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
        hint = (body.get("details") or {}).get("retryAfterSeconds")
        retry_after = float(hint) if isinstance(hint, int | float) else None
    if not message:
        message = data[:200].decode("utf-8", "replace").strip() or "no message"
    message = one_line(message, most=1000)  # the server's own words: who was refused what
    header = headers.get("Retry-After", "")
    if header.isdigit():
        retry_after = float(header)
    text = f"{what}: {status} {reason or 'error'}: {message}"
    if status == 401:
        return ClusterAuthError(
            f"{text}; the bearer token was not accepted: check that the function's IAM role has an "
            "EKS access entry on the cluster (or the kubeconfig's credentials)",
            status=status,
            reason=reason or "Unauthorized",
        )
    if status == 403:
        return ClusterAuthError(
            f"{text}; check the access policy of the role's EKS access entry and its RBAC bindings",
            status=status,
            reason=reason or "Forbidden",
        )
    if status == 404:
        return ClusterNotFoundError(text, status=status, reason=reason or "NotFound")
    if status == 409:
        return ClusterConflictError(text, status=status, reason=reason or "Conflict")
    if status in (400, 422):
        return ClusterInvalidError(text, status=status, reason=reason or "Invalid")
    if status == 410:
        return ClusterExpiredError(text, status=status, reason=reason or "Expired")
    if status == 429 or status >= 500:
        return ClusterUnavailableError(text, status=status, reason=reason, retry_after=retry_after)
    return ClusterError(text, status=status, reason=reason)

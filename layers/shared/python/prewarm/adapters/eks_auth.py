"""Authentication to EKS: bearer tokens made as `aws eks get-token` makes them, and the cluster endpoint.

An EKS token is a presigned STS `GetCallerIdentity` URL whose signature covers the `x-k8s-aws-id`
header (the cluster name); the API server replays it to STS to learn the caller's IAM identity.
boto3 is imported on first use so that importing this module costs nothing at cold start.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prewarm.services.ports import ClusterAuthError, ClusterConfigError, ClusterError, ClusterUnavailableError

if TYPE_CHECKING:
    import boto3

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
# The API server accepts a token for 15 minutes after signing whatever X-Amz-Expires says;
# 60 is what aws-cli and aws-iam-authenticator send.
PRESIGN_EXPIRES_SECONDS = 60
REFRESH_AFTER_SECONDS = 600.0

_RETRYABLE_EKS_CODES = frozenset(
    {"ThrottlingException", "TooManyRequestsException", "ServerException", "ServiceUnavailableException"}
)


def _default_session() -> boto3.Session:
    import boto3

    return boto3.Session()


class EksTokenSource:
    """A callable returning a current EKS bearer token for `cluster_name`, re-signed when it ages.

    Tokens are cached and reused until `refresh_after` seconds (10 minutes by default) have passed
    on `clock`, well inside the 15 minutes the API server accepts them.
    """

    def __init__(
        self,
        cluster_name: str,
        session: boto3.Session | None = None,
        clock: Callable[[], float] = time.time,
        refresh_after: float = REFRESH_AFTER_SECONDS,
    ) -> None:
        if not cluster_name:
            raise ClusterConfigError("an EKS token needs the cluster name: set CLUSTER_NAME")
        self.cluster_name = cluster_name
        self._session = session
        self._clock = clock
        self._refresh_after = refresh_after
        self._lock = threading.Lock()
        self._signer: Any = None
        self._sts: Any = None
        self._sts_url = ""
        self._region = ""
        self._token = ""
        self._signed_at = 0.0

    def __call__(self) -> str:
        with self._lock:
            now = self._clock()
            age = now - self._signed_at
            # A clock that went backwards also re-signs: the cached token's age is unknown.
            if not self._token or not 0 <= age < self._refresh_after:
                self._token = self._sign()
                self._signed_at = now
            return self._token

    def _prepare_signer(self) -> None:
        from botocore.signers import RequestSigner

        session = self._session or _default_session()
        region = session.region_name
        if not region:
            raise ClusterConfigError(
                "no AWS region to sign the EKS token with: set AWS_REGION (STS is called in the region)"
            )
        credentials = session.get_credentials()
        if credentials is None:
            raise ClusterAuthError(
                f"no AWS credentials to sign the EKS token for cluster {self.cluster_name!r}: "
                "give the function a role, or set AWS credentials for local runs"
            )
        # The client gives the regional endpoint, service id and event hooks; the signer holds the
        # hooks weakly, so the client is kept alive with it.
        sts = self._sts = session.client("sts", region_name=region)
        self._region = region
        self._sts_url = f"{sts.meta.endpoint_url}/?Action=GetCallerIdentity&Version=2011-06-15"
        self._signer = RequestSigner(
            sts.meta.service_model.service_id, region, "sts", "v4", credentials, sts.meta.events
        )

    def _sign(self) -> str:
        if self._signer is None:
            self._prepare_signer()
        request = {
            "method": "GET",
            "url": self._sts_url,
            "body": {},
            "headers": {CLUSTER_ID_HEADER: self.cluster_name},
            "context": {},
        }
        url = self._signer.generate_presigned_url(
            request, region_name=self._region, expires_in=PRESIGN_EXPIRES_SECONDS, operation_name=""
        )
        encoded = base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
        return TOKEN_PREFIX + encoded


_endpoints: dict[tuple[str, str], tuple[str, str]] = {}
_endpoints_lock = threading.Lock()


def describe_cluster_endpoint(cluster_name: str, session: boto3.Session | None = None) -> tuple[str, str]:
    """The API endpoint URL and base64 PEM CA data of an EKS cluster, cached for the process."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

    if not cluster_name:
        raise ClusterConfigError("no EKS cluster to describe: set CLUSTER_NAME")
    session = session or _default_session()
    key = (cluster_name, session.region_name or "")
    with _endpoints_lock:
        cached = _endpoints.get(key)
    if cached is not None:
        return cached
    try:
        cluster = session.client("eks").describe_cluster(name=cluster_name)["cluster"]
    except ClientError as e:
        raise _describe_error(cluster_name, key[1], e) from e
    except NoRegionError as e:
        raise ClusterConfigError(
            f"no AWS region to find EKS cluster {cluster_name!r} in: set AWS_REGION"
        ) from e
    except NoCredentialsError as e:
        raise ClusterAuthError(f"no AWS credentials to describe EKS cluster {cluster_name!r}") from e
    except BotoCoreError as e:
        raise ClusterUnavailableError(f"EKS DescribeCluster of {cluster_name!r} failed: {e}") from e
    endpoint = cluster.get("endpoint") or ""
    ca_data = (cluster.get("certificateAuthority") or {}).get("data") or ""
    if not endpoint or not ca_data:
        raise ClusterUnavailableError(
            f"EKS cluster {cluster_name!r} is {cluster.get('status', 'not ready')} and has no API endpoint "
            "or CA data yet; retry when it is ACTIVE"
        )
    with _endpoints_lock:
        _endpoints[key] = (endpoint, ca_data)
    return endpoint, ca_data


def _describe_error(cluster_name: str, region: str, error: Any) -> ClusterError:
    code = error.response.get("Error", {}).get("Code", "")
    detail = error.response.get("Error", {}).get("Message", "") or str(error)
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code == "ResourceNotFoundException":
        return ClusterConfigError(
            f"EKS cluster {cluster_name!r} not found in region {region or '(default)'}: check CLUSTER_NAME",
            status=status,
            reason=code,
        )
    if code in {"AccessDeniedException", "UnauthorizedException", "UnrecognizedClientException"}:
        return ClusterAuthError(
            f"not allowed to describe EKS cluster {cluster_name!r} ({detail}): "
            "grant eks:DescribeCluster to the function's role",
            status=status,
            reason=code,
        )
    if code in _RETRYABLE_EKS_CODES:
        return ClusterUnavailableError(
            f"EKS DescribeCluster of {cluster_name!r} failed, retry later: {code}: {detail}",
            status=status,
            reason=code,
        )
    return ClusterError(
        f"EKS DescribeCluster of {cluster_name!r} failed: {code}: {detail}", status=status, reason=code
    )

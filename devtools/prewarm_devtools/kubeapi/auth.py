"""Who a request is: bearer tokens mapped to identities, as an EKS cluster maps them.

Two kinds of token are known. A static token maps straight to an `Identity` (as a kubeconfig
user of a cluster admin, or a service account token). An EKS token (`k8s-aws-v1.` and a presigned
STS `GetCallerIdentity` URL, as `aws eks get-token` makes) names an AWS access key: the key maps
to an IAM principal, and the principal's access entry gives the Kubernetes user and groups, as
EKS access entries (or the `aws-auth` ConfigMap's mapRoles) do. The token's form and its 15-minute
lifetime are checked; given the cluster's name (`cluster_name`), so is its signature, over the
`x-k8s-aws-id` header set to that name: EKS replays the URL to STS with its own cluster id in that
header, so a token made for another cluster fails STS's signature check and the request gets 401
("Grant IAM users access to Kubernetes with EKS access entries", EKS User Guide; aws-iam-authenticator's
token verifier). Every local principal signs with one known secret key (`LOCAL_SECRET_ACCESS_KEY`,
`sam.aws.LocalIdentity`), so the signature can be checked here as STS would.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import hmac
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "ANONYMOUS",
    "AUTHENTICATED",
    "DEFAULT_CLUSTER_CREATOR",
    "EKS_TOKEN_PREFIX",
    "MASTERS",
    "AccessEntry",
    "Authenticator",
    "Identity",
    "service_account",
]

EKS_TOKEN_PREFIX = "k8s-aws-v1."
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
# The IAM principal that created the local cluster: moto answers GetCallerIdentity with this user
# for any access key it does not know, so every local AWS credential is this principal by default.
DEFAULT_CLUSTER_CREATOR = "arn:aws:iam::123456789012:user/moto"
# The API server accepts an EKS token for 15 minutes after it was signed.
EKS_TOKEN_LIFETIME = 15 * 60
# The header whose signed value names the cluster a token is for (aws-iam-authenticator's `clusterIDHeader`).
CLUSTER_ID_HEADER = "x-k8s-aws-id"
# The secret key every local principal signs with (`sam.aws.LocalIdentity`, the operator's `local`).
LOCAL_SECRET_ACCESS_KEY = "local"

_ASSUMED_ROLE = re.compile(r"^arn:(aws[\w-]*):sts::(\d{12}):assumed-role/([^/]+)/(.+)$")
_IAM_ARN = re.compile(r"^arn:(aws[\w-]*):iam::(\d{12}):(role|user)/(?:.*/)?([^/]+)$")


class AuthenticationError(Exception):
    """The token is not one this cluster accepts: the request gets 401 Unauthorized."""


@dataclass(frozen=True)
class Identity:
    """A Kubernetes user as the authenticator hands it to authorization: name and groups.

    `Identity("alice", ("developers",))`; `authenticated()` adds `system:authenticated`, as the
    API server does for every authenticated user.
    """

    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    # The user's extra attributes (`userInfo.extra`), as pairs so the identity stays hashable.
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def authenticated(self) -> Identity:
        if AUTHENTICATED in self.groups or self.user == ANONYMOUS.user:
            return self
        return Identity(self.user, (*self.groups, AUTHENTICATED), self.uid, self.extra)

    @property
    def extra_map(self) -> dict[str, list[str]]:
        """`userInfo.extra` as the API writes it: key → values."""
        return {key: list(values) for key, values in self.extra}


ANONYMOUS = Identity("system:anonymous", (UNAUTHENTICATED,))
ADMIN = Identity("kubernetes-admin", (MASTERS,))


#: The user extra a bound service account token carries: the node of the pod it was issued for.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def service_account(namespace: str, name: str, *, node: str | None = None) -> Identity:
    """The identity of a service account's token: `system:serviceaccount:<ns>:<name>` and its groups.

    With `node`, a token bound to a pod on that node, as the kubelet projects it (Kubernetes 1.30 and
    later): its user extra `authentication.kubernetes.io/node-name` names the node.
    """
    return Identity(
        f"system:serviceaccount:{namespace}:{name}", ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
        extra=((NODE_NAME_EXTRA, (node,)),) if node else (),
    )


@dataclass(frozen=True)
class AccessEntry:
    """What an IAM principal is in the cluster, as an EKS access entry says it.

    `username` may use `{{SessionName}}` and `{{AccountID}}`; left empty it is EKS's default: the
    user's ARN, or `arn:aws:sts::<account>:assumed-role/<role>/{{SessionName}}` for a role.
    `groups` are the entry's Kubernetes groups (RBAC binds them).
    """

    username: str = ""
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Caller:
    principal: str  # the IAM role or user ARN the access entry is keyed on
    account: str
    session: str
    default_username: str


def _caller(arn: str) -> _Caller:
    assumed = _ASSUMED_ROLE.match(arn)
    if assumed:
        partition, account, role, session = assumed.groups()
        return _Caller(
            f"arn:{partition}:iam::{account}:role/{role}",
            account,
            session,
            f"arn:{partition}:sts::{account}:assumed-role/{role}/{{{{SessionName}}}}",
        )
    iam = _IAM_ARN.match(arn)
    if iam:
        partition, account, kind, name = iam.groups()
        principal = f"arn:{partition}:iam::{account}:{kind}/{name}"
        if kind == "role":
            return _Caller(
                principal, account, "", f"arn:{partition}:sts::{account}:assumed-role/{name}/{{{{SessionName}}}}"
            )
        return _Caller(principal, account, "", principal)
    raise ValueError(f"not an IAM user, role or assumed-role ARN: {arn!r}")


class Authenticator:
    """Bearer token → `Identity`, with tables that can grow while the server runs (thread-safe)."""

    def __init__(
        self,
        identities: Mapping[str, Identity] | None = None,
        *,
        aws_principals: Mapping[str, str] | None = None,
        access_entries: Mapping[str, AccessEntry] | None = None,
        default_aws_principal: str | None = DEFAULT_CLUSTER_CREATOR,
        clock: Callable[[], float] = time.time,
        cluster_name: str | None = None,
        signing_secret: Callable[[str], str | None] = lambda key: LOCAL_SECRET_ACCESS_KEY,
    ) -> None:
        """`cluster_name`: the EKS cluster this is, whose name a token's signature must cover (None: the
        signature is not checked). `signing_secret(access_key)`: the secret key that signs with it."""
        self._lock = threading.Lock()
        self.cluster_name = cluster_name
        self._signing_secret = signing_secret
        self._identities = dict(identities or {})
        self._aws_principals: dict[str, str] = {}
        self._access_entries: dict[str, AccessEntry] = {}
        self.default_aws_principal = default_aws_principal
        self._clock = clock
        for key, arn in (aws_principals or {}).items():
            self.map_access_key(key, arn)
        for arn, entry in (access_entries or {}).items():
            self.add_access_entry(arn, entry)

    def add_identity(self, token: str, identity: Identity) -> None:
        if not token:
            raise ValueError("a token must not be empty")
        with self._lock:
            self._identities[token] = identity

    def remove_identity(self, token: str) -> None:
        with self._lock:
            self._identities.pop(token, None)

    def map_access_key(self, access_key_id: str, principal_arn: str) -> None:
        """EKS tokens signed with `access_key_id` are from `principal_arn` (as STS would answer)."""
        _caller(principal_arn)
        with self._lock:
            self._aws_principals[access_key_id] = principal_arn

    def add_access_entry(self, principal_arn: str, entry: AccessEntry) -> None:
        """An access entry for an IAM role or user ARN (an assumed-role ARN names its role)."""
        principal = _caller(principal_arn).principal
        with self._lock:
            self._access_entries[principal] = entry

    def remove_access_entry(self, principal_arn: str) -> None:
        with self._lock:
            self._access_entries.pop(_caller(principal_arn).principal, None)

    def authenticate(self, token: str) -> Identity:
        """The identity of `token` (with `system:authenticated`), or AuthenticationError."""
        with self._lock:
            identity = self._identities.get(token)
        if identity is not None:
            return identity.authenticated()
        if token.startswith(EKS_TOKEN_PREFIX):
            return self._eks_identity(token).authenticated()
        raise AuthenticationError("unknown token")

    def _eks_identity(self, token: str) -> Identity:
        access_key, _ = self._parse_eks_token(token)
        if self.cluster_name is not None:
            self._check_signature(token, access_key)
        with self._lock:
            arn = self._aws_principals.get(access_key, self.default_aws_principal)
        if arn is None:
            raise AuthenticationError(f"access key {access_key} belongs to no known IAM principal")
        caller = _caller(arn)
        with self._lock:
            entry = self._access_entries.get(caller.principal)
        if entry is None:
            raise AuthenticationError(f"{caller.principal} has no access entry")
        template = entry.username or caller.default_username
        session = caller.session or access_key
        username = template.replace("{{SessionName}}", session).replace("{{AccountID}}", caller.account)
        return Identity(username, entry.groups, f"aws-iam-authenticator:{caller.account}:{access_key}")

    def _check_signature(self, token: str, access_key: str) -> None:
        """STS's check of the presigned URL, with the header set to this cluster's name."""
        assert self.cluster_name is not None
        secret = self._signing_secret(access_key)
        if secret is None:
            raise AuthenticationError(f"access key {access_key} is not known to STS")
        if not signature_matches(_token_url(token), self.cluster_name, secret):
            raise AuthenticationError(
                f"the EKS token's signature does not match: it was not made for cluster {self.cluster_name} "
                f"(its {CLUSTER_ID_HEADER} header names another)")

    def _parse_eks_token(self, token: str) -> tuple[str, float]:
        """The access key and signing time of a presigned GetCallerIdentity URL."""
        url = _token_url(token)
        parts = urlsplit(url)
        query = {k.lower(): v[-1] for k, v in parse_qs(parts.query).items()}
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/"):
            raise AuthenticationError("the EKS token is not an STS URL")
        if query.get("action") != "GetCallerIdentity" or query.get("version") != "2011-06-15":
            raise AuthenticationError("the EKS token is not a GetCallerIdentity request")
        if "x-k8s-aws-id" not in query.get("x-amz-signedheaders", "").split(";"):
            raise AuthenticationError("the EKS token does not sign the x-k8s-aws-id header")
        credential = query.get("x-amz-credential", "").split("/")
        if len(credential) != 5 or not credential[0] or credential[3] != "sts":
            raise AuthenticationError("the EKS token has no STS credential scope")
        try:
            signed = calendar.timegm(time.strptime(query.get("x-amz-date", ""), "%Y%m%dT%H%M%SZ"))
        except ValueError:
            raise AuthenticationError("the EKS token has no valid X-Amz-Date") from None
        if self._clock() > signed + EKS_TOKEN_LIFETIME:
            raise AuthenticationError("the EKS token has expired")
        return credential[0], float(signed)


def _token_url(token: str) -> str:
    encoded = token[len(EKS_TOKEN_PREFIX) :]
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise AuthenticationError("the EKS token is not base64") from None


def signature_matches(url: str, cluster_name: str, secret_key: str) -> bool:
    """Whether the presigned STS URL's SigV4 signature is the one `secret_key` makes with the
    `x-k8s-aws-id` header set to `cluster_name` (as STS computes it when EKS replays the URL)."""
    from botocore.auth import SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    values = dict(query)
    try:
        access_key, _, region, service, _ = values["X-Amz-Credential"].split("/")
        given, timestamp, expires = values["X-Amz-Signature"], values["X-Amz-Date"], int(values["X-Amz-Expires"])
    except (KeyError, ValueError):
        return False
    unsigned = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "X-Amz-Signature"])))
    request = AWSRequest(method="GET", url=unsigned, headers={CLUSTER_ID_HEADER: cluster_name})
    request.context["timestamp"] = timestamp
    auth = SigV4QueryAuth(Credentials(access_key, secret_key), service, region, expires=expires)
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    return hmac.compare_digest(expected, given)

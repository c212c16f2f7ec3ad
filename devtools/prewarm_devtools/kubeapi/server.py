"""The HTTP/1.1 front of the embedded API server: routing, authentication (bearer tokens to
identities), impersonation, RBAC authorization, JSON bodies (Tables of custom resources when asked),
`Warning` headers, OpenAPI, keep-alive, and chunked streaming for watches. Binds to 127.0.0.1 only,
over plain HTTP or (`tls=True`) HTTPS with a CA made at start.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import select
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.auth import (
    ADMIN,
    ANONYMOUS,
    AUTHENTICATED,
    DEFAULT_CLUSTER_CREATOR,
    MASTERS,
    UNAUTHENTICATED,
    AccessEntry,
    AuthenticationError,
    Authenticator,
    Identity,
)
from prewarm_devtools.kubeapi.catalog import BUILT_IN, Catalog
from prewarm_devtools.kubeapi.certificates import ServingCertificate
from prewarm_devtools.kubeapi.errors import FieldError, StatusError
from prewarm_devtools.kubeapi.kubelet import Kubelets
from prewarm_devtools.kubeapi.openapi import (
    V2_PROTOBUF,
    V2_PROTOBUF_ACCEPTED,
    document,
    index,
    path_of,
    v2_document,
)
from prewarm_devtools.kubeapi.protobuf import PROTOBUF, ProtobufError, decode_review
from prewarm_devtools.kubeapi.rbac import BOOTSTRAP_POLICY, Attributes, Authorizer, request_attributes
from prewarm_devtools.kubeapi.registry import (
    APPLY_PATCH,
    CUSTOM_PATCH_TYPES,
    FIELD_VALIDATIONS,
    PATCH_TYPES,
    ListQuery,
    Registry,
)
from prewarm_devtools.kubeapi.representation import PARTIAL, PARTIAL_LIST, TABLE, as_partial_metadata, negotiate
from prewarm_devtools.kubeapi.resources import REVIEWS
from prewarm_devtools.kubeapi.resources.reviews import SELF_SUBJECT_ACCESS_REVIEWS, SELF_SUBJECT_REVIEWS
from prewarm_devtools.kubeapi.resources.scheduling import SYSTEM_PRIORITY_CLASSES
from prewarm_devtools.kubeapi.resources.types import ResourceType
from prewarm_devtools.kubeapi.seed import load_objects
from prewarm_devtools.kubeapi.selectors import FieldSelector, LabelSelector, SelectorParseError
from prewarm_devtools.kubeapi.store import Store, dumps
from prewarm_devtools.kubeapi.table import to_table

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

__all__ = ["ANONYMOUS_MODES", "KubeApiServer"]

log = logging.getLogger(__name__)

DEFAULT_VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.5-eks-3025e55",
    "gitCommit": "f5ab2e8f1c9a4bfbd4a2f0d7c9dd43a0b3a2a1e4",
    "gitTreeState": "clean",
    "buildDate": "2025-09-30T18:22:11Z",
    "goVersion": "go1.24.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}
# How requests without a token fare: 401 (anonymous auth off); as system:anonymous, which RBAC
# lets read /version and health only (EKS: anonymous auth on); or as the cluster admin (kubectl
# sends no token over plain HTTP: serve with `tls=True` instead where RBAC must hold).
ANONYMOUS_MODES = ("unauthorized", "forbidden", "allowed")
_DEFAULT_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
_JSON = "application/json"
_YAML = "application/yaml"
# Seconds a TLS client has to finish its handshake.
_HANDSHAKE_TIMEOUT = 10.0


@dataclass
class _Response:
    code: int
    body: bytes = b""
    content_type: str = _JSON
    stream: Iterator[bytes | None] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Failure:
    error: StatusError
    remaining: int | None
    method: str | None
    path_prefix: str


@dataclass(frozen=True)
class _Target:
    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str = ""


class KubeApiServer:
    """A Kubernetes API server for core/v1 nodes, namespaces, pods, secrets, service accounts,
    ConfigMaps and Events, apps/v1 DaemonSets, scheduling.k8s.io/v1 PriorityClasses, RBAC
    (rbac.authorization.k8s.io/v1, enforced on every request), and CustomResourceDefinitions
    (apiextensions.k8s.io/v1) with the resources they define.

    `with KubeApiServer() as api:` serves on a free port of 127.0.0.1 until the block ends;
    `api.client_configuration()` is a configured `kubernetes.client.Configuration` for the admin.

    Who a request is:
    - `token` (random unless given) is the cluster admin's: user `kubernetes-admin`, group
      `system:masters`, which RBAC never refuses, as on a real cluster.
    - `identities` maps more static tokens to identities: `{"t0k3n": Identity("alice", ("dev",))}`,
      or `service_account("ns", "name")`; `add_identity` adds one while the server runs.
    - EKS tokens (`k8s-aws-v1.`, as `aws eks get-token` signs them) name an AWS access key:
      `aws_principals` maps access keys to IAM ARNs (as STS would answer; `map_access_key` adds
      one), and `access_entries` maps IAM role or user ARNs to an `AccessEntry` (username and
      Kubernetes groups), as EKS access entries do (`add_access_entry`). A key that
      `aws_principals` does not name is `default_aws_principal`: as moto answers for any key, every
      local AWS credential is the cluster creator, which (as EKS bootstraps the creator) has an
      admin entry unless `access_entries` is given. `default_aws_principal=None` makes such tokens
      401. With `cluster_name`, a token must be signed for that cluster (its `x-k8s-aws-id`), as EKS
      checks. Any other token is 401 Unauthorized.
    - `anonymous` says what requests without a token get (see ANONYMOUS_MODES).
    - `Impersonate-User`/`Impersonate-Group` headers (kubectl `--as`, `--as-group`) act as another
      identity when RBAC allows the `impersonate` verb.

    `tls=True` serves HTTPS with a CA and a certificate for 127.0.0.1 made at construction
    (`ca_pem`): kubectl sends a kubeconfig's token over TLS only, so `write_kubeconfig` then gives
    kubectl the admin with RBAC enforced for everyone else.

    What it may do: the stored ClusterRoles, Roles and their bindings decide (plus the bootstrap
    policy: discovery, self reviews, health), and a denial is the API server's 403.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        token: str | None = None,
        identities: Mapping[str, Identity] | None = None,
        aws_principals: Mapping[str, str] | None = None,
        access_entries: Mapping[str, AccessEntry] | None = None,
        default_aws_principal: str | None = DEFAULT_CLUSTER_CREATOR,
        anonymous: str = "unauthorized",
        tls: bool = False,
        default_namespaces: bool = True,
        bootstrap_policy: bool = True,
        version: dict[str, str] | None = None,
        watch_timeout: float = 1800.0,
        bookmark_interval: float = 60.0,
        continue_ttl: float = 300.0,
        max_events: int = 10_000,
        clock: Callable[[], float] = time.time,
        cluster_name: str | None = None,
    ) -> None:
        self.token = token or f"admin-{secrets.token_urlsafe(24)}"
        if access_entries is None:
            access_entries = {DEFAULT_CLUSTER_CREATOR: AccessEntry(groups=(MASTERS,))}
        self.authenticator = Authenticator(
            {self.token: ADMIN, **(identities or {})},
            aws_principals=aws_principals,
            access_entries=access_entries,
            default_aws_principal=default_aws_principal,
            clock=clock,
            cluster_name=cluster_name,
        )
        if anonymous not in ANONYMOUS_MODES:
            raise ValueError(f"anonymous must be one of {', '.join(ANONYMOUS_MODES)}, got {anonymous!r}")
        self.anonymous = anonymous
        self.certificate = ServingCertificate.generate() if tls else None
        self._tls_context = self.certificate.server_context() if self.certificate is not None else None
        self.version = dict(version or DEFAULT_VERSION)
        self.watch_timeout = watch_timeout
        self.bookmark_interval = bookmark_interval
        self.store = Store(
            {r.storage: r.field_values for r in BUILT_IN.values()}, max_events=max_events, snapshot_ttl=continue_ttl
        )
        self.catalog = Catalog()
        self.registry = Registry(self.store, catalog=self.catalog)
        self.authorizer = Authorizer(self.store)
        # What answers behind the node proxy (`/api/v1/nodes/NAME/proxy/configz`).
        self.kubelets = Kubelets()
        self._port = port
        self._failures: list[_Failure] = []
        self._failures_lock = threading.Lock()
        self._httpd: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        if default_namespaces:
            self.registry.seed([{"kind": "Namespace", "metadata": {"name": n}} for n in _DEFAULT_NAMESPACES])
        if bootstrap_policy:
            self.registry.seed(list(BOOTSTRAP_POLICY))
        # The scheduling bootstrap hook makes these on every real API server.
        self.registry.seed(list(SYSTEM_PRIORITY_CLASSES))

    # -- identities ----------------------------------------------------------------------------------

    def add_identity(self, token: str, identity: Identity) -> None:
        """Requests with bearer `token` are `identity` from now on (also while serving)."""
        self.authenticator.add_identity(token, identity)

    def remove_identity(self, token: str) -> None:
        """`token` is refused (401) from now on."""
        self.authenticator.remove_identity(token)

    def map_access_key(self, access_key_id: str, principal_arn: str) -> None:
        """EKS tokens signed with `access_key_id` come from `principal_arn` (role, user or assumed role)."""
        self.authenticator.map_access_key(access_key_id, principal_arn)

    def add_access_entry(self, principal_arn: str, entry: AccessEntry) -> None:
        """Give an IAM role or user an access entry: its Kubernetes username and groups."""
        self.authenticator.add_access_entry(principal_arn, entry)

    def remove_access_entry(self, principal_arn: str) -> None:
        self.authenticator.remove_access_entry(principal_arn)

    def set_image_credentials_policy(self, node: str, policy: str | None, allowlist: Sequence[str] = ()) -> None:
        """Node `node`'s kubelet reports `imagePullCredentialsVerificationPolicy: policy` at `/configz`
        (None: KEP-2535's feature gate off); see `kubelet.Kubelets`."""
        self.kubelets.set_image_credentials_policy(node, policy, allowlist)

    def allowed(self, identity: Identity, attributes: Attributes) -> bool:
        """Whether RBAC lets `identity` (as authenticated) do what `attributes` say."""
        return self.authorizer.authorize(identity.authenticated(), attributes).allowed

    # -- life cycle ----------------------------------------------------------------------------------

    def start(self) -> KubeApiServer:
        """Bind 127.0.0.1 and serve in a background thread."""
        if self._httpd is not None:
            raise RuntimeError("the API server is already running")
        self.store.reopen()
        self._httpd = _HttpServer(("127.0.0.1", self._port), _Handler, self, self._tls_context)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="kubeapi", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: end watches, close every connection, join the threads."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self.store.close()
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        httpd.join_handlers(timeout=5)

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def serving(self) -> bool:
        """Whether it is started and not stopped."""
        return self._httpd is not None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the API server is not running: call start() or use it as a context manager")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self.certificate is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def ca_pem(self) -> str | None:
        """The CA (PEM) that signed the serving certificate, for clients to trust; None over plain HTTP."""
        return self.certificate.ca_pem if self.certificate is not None else None

    @property
    def resource_version(self) -> int:
        """The current (global) resourceVersion."""
        return self.store.rv

    # -- clients -------------------------------------------------------------------------------------

    def client_configuration(self, token: str | None = None) -> Configuration:
        """A `kubernetes.client.Configuration` for this server with `token` (the admin's by default)."""
        from kubernetes.client import Configuration

        return Configuration(
            host=self.url, api_key={"BearerToken": token or self.token}, api_key_prefix={"BearerToken": "Bearer"},
            ca_cert_data=self.ca_pem,
        )

    def api_client(self, token: str | None = None) -> ApiClient:
        """A new `kubernetes.client.ApiClient` for this server and `token`; close it when done."""
        from kubernetes.client import ApiClient

        return ApiClient(self.client_configuration(token))

    def kubeconfig(self, name: str = "prewarm-local") -> dict[str, Any]:
        """A kubeconfig for this server as the cluster admin (with the CA over TLS), as a dict; `name`
        names its cluster, user and context."""
        cluster: dict[str, Any] = {"server": self.url}
        if self.ca_pem is not None:
            cluster["certificate-authority-data"] = base64.b64encode(self.ca_pem.encode()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": cluster}],
            "users": [{"name": name, "user": {"token": self.token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
        }

    def write_kubeconfig(self, path: str | Path, name: str = "prewarm-local") -> Path:
        """Write `kubeconfig(name)` as YAML to `path`, readable by its owner only (it holds the admin token)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(yaml.safe_dump(self.kubeconfig(name), sort_keys=False))
        return target

    # -- data ----------------------------------------------------------------------------------------

    def seed_objects(self, objects: Iterable[dict[str, Any]]) -> int:
        """Store objects as they are (status included); returns how many. Existing ones are replaced."""
        return self.registry.seed(list(objects))

    def seed_from_file(self, path: str | Path) -> int:
        """Seed from a YAML or JSON file: a `List` (as `kubectl get -o yaml` prints), or documents."""
        return self.seed_objects(load_objects(path))

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object (a copy), or None. `resource`: a plural (`pods`), or a custom resource's
        plural and group (`imagepulljobs.prewarm.dev`)."""
        rtype = self._resource(resource)
        stored = self.store.get(rtype.storage, self.registry.key(rtype, namespace, name))
        return None if stored is None else json.loads(stored.raw)

    def list_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Copies of the stored objects of `resource`, in key order."""
        rtype = self._resource(resource)
        snapshot = self.store.snapshot(rtype.storage)
        lo, hi = snapshot.bounds(f"{namespace}/" if namespace is not None and rtype.namespaced else "")
        return [json.loads(e.raw) for e in snapshot.entries[lo:hi]]

    def remove_object(self, resource: str, name: str, namespace: str | None = None) -> bool:
        """Delete an object at once (no finalizers, no cascade); whether it existed."""
        return self.registry.remove(self._resource(resource), namespace, name)

    def _resource(self, resource: str) -> ResourceType:
        rtype = self.catalog.find(resource)
        if rtype is None:
            known = sorted(t.storage for t in self.catalog.stored_types())
            raise KeyError(f"unknown resource {resource!r}: one of {', '.join(known)}")
        return rtype

    def fail_requests(
        self, error: StatusError, count: int | None = 1, *, method: str | None = None, path_prefix: str = "/"
    ) -> None:
        """Answer the next `count` requests (all, when None) whose method and path match with `error`,
        as a throttling (429) or failing (5xx) EKS control plane would. `error.headers` are sent too,
        e.g. `{"Retry-After": "1"}`. Authentication is checked first."""
        if count is not None and count < 1:
            raise ValueError(f"count must be at least 1 (or None for every request), got {count}")
        with self._failures_lock:
            self._failures.append(_Failure(error, count, method.upper() if method else None, path_prefix))

    def clear_failures(self) -> None:
        """Forget the failures `fail_requests` set up."""
        with self._failures_lock:
            self._failures.clear()

    def _injected_failure(self, method: str, path: str) -> StatusError | None:
        with self._failures_lock:
            for failure in self._failures:
                if (failure.method in (None, method)) and path.startswith(failure.path_prefix):
                    if failure.remaining is not None:
                        failure.remaining -= 1
                        if failure.remaining == 0:
                            self._failures.remove(failure)
                    return failure.error
        return None

    def expire_continue_tokens(self) -> None:
        """Forget every list snapshot, as etcd compaction does: pending continue tokens get 410."""
        self.store.expire_snapshots()

    # -- requests ------------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> _Response:
        """Answer one request; StatusError becomes a Status body."""
        url = urlsplit(raw_path)
        path = "/" + "/".join(unquote(p) for p in url.path.split("/") if p)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            response = self._route(method, path, query, headers, body)
        except StatusError as e:
            response = _Response(e.code, dumps(e.status()), headers=e.headers)
        if query.get("pretty") in ("true", "1") and response.stream is None and response.content_type == _JSON:
            response.body = json.dumps(json.loads(response.body), indent=2).encode() + b"\n"
        return response

    def _identity(self, headers: Any) -> Identity:
        authorization = headers.get("Authorization") or ""
        if authorization:
            scheme, _, token = authorization.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise errors.unauthorized()
            try:
                return self.authenticator.authenticate(token)
            except AuthenticationError as e:
                log.debug("refused a bearer token: %s", e)
                raise errors.unauthorized() from None
        if self.anonymous == "unauthorized":
            raise errors.unauthorized()
        if self.anonymous == "allowed":
            return ADMIN.authenticated()
        return ANONYMOUS

    def _impersonate(self, identity: Identity, headers: Any) -> Identity:
        """The identity `Impersonate-*` headers ask for, when RBAC lets `identity` impersonate it."""
        get_all = getattr(headers, "get_all", None)
        user = headers.get("Impersonate-User") or ""
        groups = [
            g for g in (get_all("Impersonate-Group") if get_all else [headers.get("Impersonate-Group")]) or [] if g
        ]
        if not user:
            if groups:
                raise errors.internal_error("requested impersonation of groups without impersonating a user")
            return identity
        checks: list[Attributes] = []
        sa_parts = user.split(":")
        if len(sa_parts) == 4 and sa_parts[:2] == ["system", "serviceaccount"]:
            namespace = sa_parts[2]
            checks.append(_impersonation("serviceaccounts", sa_parts[3], namespace))
            if not groups:
                groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
        else:
            checks.append(_impersonation("users", user))
        checks += [_impersonation("groups", g) for g in groups]
        for check in checks:
            self.authorizer.check(identity, check)
        if user != ANONYMOUS.user and AUTHENTICATED not in groups and UNAUTHENTICATED not in groups:
            groups.append(AUTHENTICATED)
        return Identity(user, tuple(groups))

    def _route(self, method: str, path: str, query: dict[str, str], headers: Any, body: bytes) -> _Response:
        if path in ("/healthz", "/livez", "/readyz"):
            return _Response(200, b"ok", "text/plain; charset=utf-8")
        identity = self._impersonate(self._identity(headers), headers)
        injected = self._injected_failure(method, path)
        if injected is not None:
            raise injected
        attributes = request_attributes(method, path, query)
        self.authorizer.check(identity, attributes)
        parts = path.strip("/").split("/") if path != "/" else []
        if path == "/version":
            return _get_only(method, dumps(self.version))
        if path == "/api":
            versions = {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}],
            }
            return _get_only(method, dumps(versions))
        if path == "/apis":
            groups = self.catalog.api_groups()
            return _get_only(method, dumps({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
        if parts[:1] == ["apis"] and len(parts) == 2:
            group = next((g for g in self.catalog.api_groups() if g["name"] == parts[1]), None)
            if group is None:
                raise errors.route_not_found()
            return _get_only(method, dumps({"kind": "APIGroup", "apiVersion": "v1", **group}))
        if parts[:2] == ["openapi", "v3"]:
            return _get_only(method, self._openapi("/".join(parts[2:])))
        if path == "/openapi/v2":
            protobuf = any(media in (headers.get("Accept") or "") for media in V2_PROTOBUF_ACCEPTED)
            response = _get_only(method, v2_document(self.version["gitVersion"], protobuf))
            response.content_type = V2_PROTOBUF if protobuf else _JSON
            return response
        group_version = _group_version(parts, self.catalog)
        served = self.catalog.served(group_version) if group_version else None
        if group_version is None or served is None:
            raise errors.route_not_found()
        prefix_length = 2 if parts[0] == "api" else 3
        if len(parts) == prefix_length:
            return _get_only(method, dumps(self.catalog.discovery(group_version)))
        legacy_watch = parts[prefix_length] == "watch"
        rest = parts[prefix_length + 1 :] if legacy_watch else parts[prefix_length:]
        if group_version == "v1" and len(rest) >= 3 and rest[0] == "nodes" and rest[2] == "proxy":
            return self._node_proxy(method, rest[1], rest[3:])
        target = _resolve(rest, served) if rest else None
        if target is None:
            raise errors.route_not_found()
        if target.rtype.name in REVIEWS:
            return self._review(method, target, identity, headers, body)
        if target.rtype is SELF_SUBJECT_REVIEWS:
            return self._self_subject_review(method, target, identity, headers, body)
        watch = legacy_watch or _flag(query, "watch")
        if target.name is None:
            return self._collection(method, target, query, headers, body, watch, identity)
        return self._item(method, target, query, headers, body, identity)

    def _node_proxy(self, method: str, name: str, rest: list[str]) -> _Response:
        """The node proxy subresource (RBAC `get` on `nodes/proxy`, checked above): the node's kubelet."""
        node = self.get_object("nodes", name)
        if node is None:
            raise errors.not_found("nodes", name)
        code, body, content_type = self.kubelets.proxy(method, node, rest, self.version["gitVersion"])
        return _Response(code, body, content_type)

    def _openapi(self, path: str) -> bytes:
        """`/openapi/v3` (the index) or one group version's document."""
        group_versions = self.catalog.group_versions()
        if not path:
            version = self.version["gitVersion"]
            return dumps(index({path_of(gv): document(gv, served, version) for gv, served in group_versions.items()}))
        for group_version, served in group_versions.items():
            if path_of(group_version) == path:
                return dumps(document(group_version, served, self.version["gitVersion"]))
        raise errors.route_not_found()

    def _review(self, method: str, target: _Target, identity: Identity, headers: Any, body: bytes) -> _Response:
        """Answer a SelfSubjectAccessReview (for the caller) or SubjectAccessReview (for anyone)."""
        rtype = target.rtype
        if method != "POST" or target.name is not None:
            raise errors.method_not_allowed()
        if (headers.get("Content-Type") or "").split(";")[0].strip().lower() == PROTOBUF:
            try:
                decoded: Any = decode_review(body)
            except (ProtobufError, UnicodeDecodeError) as e:
                raise errors.bad_request(f"cannot decode the protobuf {rtype.kind}: {e}") from None
        else:
            decoded = _decode_body(headers, body)
        review = self.registry.check_body(rtype, decoded)
        spec = review.get("spec")
        if not isinstance(spec, dict):
            spec = review["spec"] = {}
        problems = []
        resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if resource is not None and non_resource is not None:
            problems.append(
                FieldError(
                    "Invalid",
                    "spec.nonResourceAttributes",
                    non_resource,
                    "cannot be specified in combination with resourceAttributes",
                )
            )
        elif resource is None and non_resource is None:
            problems.append(
                FieldError(
                    "Invalid",
                    "spec.resourceAttributes",
                    "null",
                    "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                )
            )
        if rtype is SELF_SUBJECT_ACCESS_REVIEWS:
            subject = identity
        else:
            groups = spec.get("groups") or []
            if not spec.get("user") and not groups:
                problems.append(
                    FieldError(
                        "Invalid",
                        "spec.user",
                        spec.get("user") or "",
                        "at least one of user or group must be specified",
                    )
                )
            subject = Identity(str(spec.get("user") or ""), tuple(str(g) for g in groups), str(spec.get("uid") or ""))
        if problems:
            raise errors.invalid(rtype.kind, "", problems, rtype.group)
        asked = _asked(resource) if resource is not None else _asked(non_resource, resource_request=False)
        decision = self.authorizer.authorize(subject, asked)
        status: dict[str, Any] = {"allowed": decision.allowed}
        if decision.reason:
            status["reason"] = decision.reason
        review["metadata"] = {"creationTimestamp": None}
        review["status"] = status
        return _Response(201, dumps(review))

    def _self_subject_review(
        self, method: str, target: _Target, identity: Identity, headers: Any, body: bytes
    ) -> _Response:
        """Answer a SelfSubjectReview (`kubectl auth whoami`): the caller as authentication (and
        impersonation) made it."""
        rtype = target.rtype
        if method != "POST" or target.name is not None:
            raise errors.method_not_allowed()
        # The review asks nothing but who calls: kubectl's protobuf body (metadata only) is not read.
        if (headers.get("Content-Type") or "").split(";")[0].strip().lower() != PROTOBUF:
            self.registry.check_body(rtype, _decode_body(headers, body))
        user: dict[str, Any] = {"username": identity.user, "groups": list(identity.groups)}
        if identity.uid:
            user["uid"] = identity.uid
        if identity.extra:
            user["extra"] = identity.extra_map
        review = {
            "kind": rtype.kind,
            "apiVersion": rtype.api_version,
            "metadata": {"creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "status": {"userInfo": user},
        }
        return _Response(201, dumps(review))

    def _collection(
        self, method: str, target: _Target, query: dict[str, str], headers: Any, body: bytes, watch: bool,
        identity: Identity,
    ) -> _Response:
        rtype, namespace = target.rtype, target.namespace
        if method == "GET":
            list_query = _list_query(rtype, query)
            if watch:
                timeout = float(_int(query, "timeoutSeconds") or self.watch_timeout)
                stream = self.registry.watch(rtype, namespace, list_query, timeout, self.bookmark_interval)
                wanted = negotiate(headers.get("Accept") or "")
                if wanted.kind == TABLE and rtype.custom is not None:
                    include = query.get("includeObject", "")
                    stream = _events_as(stream, lambda obj: to_table(rtype, obj, wanted.version, include))
                elif wanted.kind == PARTIAL:
                    stream = _events_as(stream, lambda obj: as_partial_metadata(obj, wanted, is_list=False))
                return _Response(200, stream=stream)
            return self._read(rtype, self.registry.list_collection(rtype, namespace, list_query), query, headers,
                              is_list=True)
        if method == "POST" and (namespace is not None or not rtype.namespaced):
            warnings: list[str] = []
            created = self.registry.create(
                rtype,
                namespace,
                _decode_body(headers, body),
                dry_run=_dry_run(query),
                field_validation=_field_validation(query, "CreateOptions"),
                warnings=warnings,
                user=identity.authenticated(),
                manager=_field_manager(query, headers),
            )
            return _Response(201, dumps(created), warnings=warnings)
        if method == "DELETE" and "deletecollection" in rtype.verbs:
            options = _delete_options(headers, body)
            return _Response(
                200,
                self.registry.delete_collection(
                    rtype, namespace, _list_query(rtype, query), options, dry_run=_dry_run(query, options)
                ),
            )
        raise errors.method_not_allowed()

    def _item(
        self, method: str, target: _Target, query: dict[str, str], headers: Any, body: bytes, identity: Identity
    ) -> _Response:
        rtype, namespace, name, sub = target.rtype, target.namespace, target.name, target.subresource
        assert name is not None
        dry_run = _dry_run(query)
        warnings: list[str] = []
        if method == "GET":
            return self._read(rtype, self.registry.get(rtype, namespace, name), query, headers)
        if method == "PUT":
            replaced = self.registry.replace(
                rtype,
                namespace,
                name,
                _decode_body(headers, body),
                subresource=sub,
                dry_run=dry_run,
                field_validation=_field_validation(query, "UpdateOptions"),
                warnings=warnings,
                user=identity.authenticated(),
                manager=_field_manager(query, headers),
            )
            return _Response(200, dumps(replaced), warnings=warnings)
        if method == "PATCH":
            content_type = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
            accepted = CUSTOM_PATCH_TYPES if rtype.custom is not None else PATCH_TYPES
            if content_type not in accepted:
                raise errors.unsupported_media_type(content_type, list(accepted))
            if content_type == APPLY_PATCH:
                code, applied = self.registry.apply(
                    rtype, namespace, name, _decode_body({"Content-Type": _YAML}, body),
                    manager=query.get("fieldManager", ""), force=query.get("force") in ("true", "1"),
                    subresource=sub, dry_run=dry_run, field_validation=_field_validation(query, "PatchOptions"),
                    warnings=warnings, user=identity.authenticated(),
                )
                return _Response(code, dumps(applied), warnings=warnings)
            try:
                patch = json.loads(body or b"null")
            except ValueError as e:
                raise errors.bad_request(f"error decoding patch: {e}") from None
            patched = self.registry.patch(
                rtype,
                namespace,
                name,
                content_type,
                patch,
                subresource=sub,
                dry_run=dry_run,
                field_validation=_field_validation(query, "PatchOptions"),
                warnings=warnings,
                user=identity.authenticated(),
                manager=_field_manager(query, headers),
            )
            return _Response(200, dumps(patched), warnings=warnings)
        if method == "DELETE" and not sub:
            options = _delete_options(headers, body)
            return _Response(
                200,
                dumps(self.registry.delete(rtype, namespace, name, options, dry_run=_dry_run(query, options),
                                           user=identity.authenticated())),
            )
        raise errors.method_not_allowed()

    def _read(
        self, rtype: ResourceType, body: bytes, query: dict[str, str], headers: Any, *, is_list: bool = False
    ) -> _Response:
        """A GET's answer as the Accept header prefers: JSON, the metadata alone, or for a custom resource a
        Table (a built-in resource's Table is its JSON here: no table convertors for them)."""
        wanted = negotiate(headers.get("Accept") or "")
        if wanted.kind in (PARTIAL, PARTIAL_LIST):
            return _Response(200, dumps(as_partial_metadata(json.loads(body), wanted, is_list=is_list)))
        if wanted.kind == TABLE and rtype.custom is not None:
            return _Response(200, dumps(to_table(rtype, json.loads(body), wanted.version,
                                                 query.get("includeObject", ""))))
        return _Response(200, body)


def _group_version(parts: list[str], catalog: Catalog) -> str | None:
    """The served group version a path is under (`v1`, `rbac.authorization.k8s.io/v1`), or None."""
    if parts[:2] == ["api", "v1"]:
        return "v1"
    if len(parts) >= 3 and parts[0] == "apis" and catalog.served(f"{parts[1]}/{parts[2]}") is not None:
        return f"{parts[1]}/{parts[2]}"
    return None


def _resolve(parts: list[str], served: Mapping[str, ResourceType]) -> _Target | None:
    """What a path under a group version names, or None for no such resource."""
    if parts[0] == "namespaces" and len(parts) >= 3 and parts[2] in served:
        rtype = served[parts[2]]
        if not rtype.namespaced or len(parts) > 5:
            return None
        name = parts[3] if len(parts) > 3 else None
        sub = parts[4] if len(parts) > 4 else ""
        if sub and (sub != "status" or not rtype.has_status):
            return None
        return _Target(rtype, parts[1], name, sub)
    found = served.get(parts[0])
    if found is None or len(parts) > 3:
        return None
    if len(parts) == 1:
        return _Target(found, None, None)
    if found.namespaced:
        return None
    sub = parts[2] if len(parts) > 2 else ""
    if sub and (sub != "status" or not found.has_status):
        return None
    return _Target(found, None, parts[1], sub)


def _asked(attributes: Any, resource_request: bool = True) -> Attributes:
    """The attributes an access review's `resourceAttributes` or `nonResourceAttributes` give."""
    if not isinstance(attributes, dict):
        raise errors.bad_request("the attributes of an access review must be an object")

    def text(key: str) -> str:
        return str(attributes.get(key) or "")

    if not resource_request:
        return Attributes(verb=text("verb"), resource_request=False, path=text("path"))
    return Attributes(
        verb=text("verb"),
        resource_request=True,
        group=text("group"),
        version=text("version"),
        resource=text("resource"),
        subresource=text("subresource"),
        namespace=text("namespace"),
        name=text("name"),
    )


def _impersonation(resource: str, name: str, namespace: str = "") -> Attributes:
    return Attributes(
        verb="impersonate", resource_request=True, resource=resource, namespace=namespace, name=name, version="v1"
    )


def _get_only(method: str, body: bytes) -> _Response:
    if method != "GET":
        raise errors.method_not_allowed()
    return _Response(200, body)


def _flag(query: dict[str, str], name: str) -> bool:
    value = query.get(name)
    if value is None or value == "":
        return False
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if value in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise errors.bad_request(f'{name}: invalid value "{value}": must be true or false')


def _int(query: dict[str, str], name: str) -> int:
    value = query.get(name, "")
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise errors.bad_request(f'{name}: invalid value "{value}": must be an integer') from None


def _list_query(rtype: ResourceType, query: dict[str, str]) -> ListQuery:
    try:
        labels = LabelSelector.parse(query.get("labelSelector", ""))
        fields = FieldSelector.parse(query.get("fieldSelector", ""), rtype.convert_field)
    except SelectorParseError as e:
        raise errors.bad_request(str(e)) from None
    send_initial = _flag(query, "sendInitialEvents") if query.get("sendInitialEvents") else None
    return ListQuery(
        label_selector=labels,
        field_selector=fields,
        limit=_int(query, "limit"),
        continue_token=query.get("continue", ""),
        resource_version=query.get("resourceVersion", ""),
        resource_version_match=query.get("resourceVersionMatch", ""),
        send_initial_events=send_initial,
        allow_bookmarks=_flag(query, "allowWatchBookmarks"),
    )


def _field_validation(query: dict[str, str], options_kind: str) -> str:
    """What a write's unknown fields get (`fieldValidation`): Warn unless the request says otherwise."""
    value = query.get("fieldValidation", "")
    if value and value not in FIELD_VALIDATIONS:
        allowed = ", ".join(f'"{v}"' for v in ("", *FIELD_VALIDATIONS))
        problem = FieldError("NotSupported", "fieldValidation", value, f"supported values: {allowed}")
        raise errors.invalid(f"{options_kind}.meta.k8s.io", "", [problem])
    return value or "Warn"


def _dry_run(query: dict[str, str], options: dict[str, Any] | None = None) -> bool:
    """Whether the request is a dry run: `?dryRun=All`, or `dryRun: ["All"]` in DeleteOptions."""
    value = query.get("dryRun", "")
    if value and value != "All":
        raise errors.bad_request(f'Unsupported value: "{value}": supported values: "All"')
    in_body = (options or {}).get("dryRun")
    if in_body:
        if not isinstance(in_body, list) or any(v != "All" for v in in_body):
            raise errors.invalid(
                "DeleteOptions.meta.k8s.io",
                "",
                [FieldError("NotSupported", "dryRun", in_body, 'supported values: "All"')],
            )
        return True
    return value == "All"


def _events_as(stream: Iterator[bytes | None], transform: Callable[[dict[str, Any]], dict[str, Any]]
               ) -> Iterator[bytes | None]:
    """A watch whose event objects are shown as the Accept header asks, as the API server transforms them
    (not a BOOKMARK's, nor an ERROR's Status): a Table of the object's one row (`kubectl get -w` of custom
    resources), or its metadata alone (a metadata informer's PartialObjectMetadata)."""
    for line in stream:
        if not line:
            yield line
            continue
        event = json.loads(line)
        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
            event["object"] = transform(event["object"])
            line = dumps(event) + b"\n"
        yield line


def _field_manager(query: dict[str, str], headers: Any) -> str:
    """Who owns the fields a write sets: `fieldManager`, else the User-Agent's product, as the API server
    derives it (prefixFromUserAgent: up to the first '/', at most 128 characters)."""
    return query.get("fieldManager") or (headers.get("User-Agent") or "").split("/")[0][:128]


def _decode_body(headers: Any, body: bytes) -> Any:
    content_type = (headers.get("Content-Type") or _JSON).split(";")[0].strip().lower()
    if content_type in (_JSON, "*/*", ""):
        try:
            return json.loads(body or b"null")
        except ValueError as e:
            raise errors.bad_request(f"couldn't get version/kind; json parse error: {e}") from None
    if content_type in (_YAML, "application/x-yaml", "text/yaml"):
        try:
            return yaml.safe_load(body or b"")
        except yaml.YAMLError as e:
            raise errors.bad_request(f"error converting YAML to JSON: {e}") from None
    raise errors.unsupported_media_type(content_type, [_JSON, _YAML])


def _delete_options(headers: Any, body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    options = _decode_body(headers, body)
    if not isinstance(options, dict):
        raise errors.bad_request("DeleteOptions must be a JSON object")
    return options


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # Benchmarks open many connections at once; the default backlog of 5 would refuse some.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], api: KubeApiServer,
                 tls: ssl.SSLContext | None = None) -> None:
        self.api = api
        self.tls = tls
        self._live: dict[socket.socket, threading.Thread] = {}
        self._handler_threads: set[threading.Thread] = set()
        self._live_lock = threading.Lock()
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        if self.tls is None:
            return connection, address
        # The handshake happens in the connection's own thread (`_Handler.setup`): a slow or silent
        # client must not hold up the accept loop.
        return self.tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gives up mid-handshake (or probes with plain HTTP) is not a server failure.
        log.debug("connection from %s failed", client_address, exc_info=True)

    def process_request(self, request: Any, client_address: Any) -> None:
        # One thread per connection, known from the start so that stop() can close and join it.
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), name="kubeapi-connection", daemon=True
        )
        with self._live_lock:
            self._handler_threads = {t for t in self._handler_threads if t.is_alive()}
            self._handler_threads.add(thread)
            self._live[request] = thread
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        with self._live_lock:
            self._live.pop(request, None)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._live_lock:
            connections = list(self._live)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                log.debug("connection already closed", exc_info=True)

    def join_handlers(self, timeout: float) -> None:
        with self._live_lock:
            threads = list(self._handler_threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kube-apiserver"
    sys_version = ""
    server: _HttpServer

    def setup(self) -> None:
        # Headers and body go in separate writes: without NODELAY, Nagle would delay the body.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(_HANDSHAKE_TIMEOUT)
            self.request.do_handshake()  # failures go to _HttpServer.handle_error
            self.request.settimeout(None)
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            log.debug("client went away before the response was flushed", exc_info=True)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_OPTIONS(self) -> None:
        self._serve("OPTIONS")

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self, method: str) -> None:
        try:
            body = self._read_body()
            response = self.server.api.handle(method, self.path, self.headers, body)
        except Exception:
            log.exception("the embedded API server failed on %s %s", method, self.path)
            response = _Response(
                500, dumps(errors.internal_error("unexpected server error; see the server log").status())
            )
        try:
            if response.stream is not None:
                self._stream(response.stream)
            else:
                self._send(response)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    def _start(self, response: _Response) -> None:
        self.send_response(response.code)
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Content-Type", response.content_type)
        for name, value in response.headers.items():
            self.send_header(name, value)
        for warning in response.warnings:
            self.send_header("Warning", '299 - "' + warning.replace("\\", "\\\\").replace('"', '\\"') + '"')

    def _send(self, response: _Response) -> None:
        self._start(response)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    def _stream(self, stream: Iterator[bytes | None]) -> None:
        self._start(_Response(200))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for line in stream:
                if line is None:
                    if self._client_gone():
                        self.close_connection = True
                        return
                    continue
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            # The client closed the watch (or the server is stopping): nothing more to send.
            self.close_connection = True
        except Exception:
            # Headers are out: the only way left to report a failure is to cut the stream.
            log.exception("the embedded API server failed while streaming %s", self.path)
            self.close_connection = True

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            if not isinstance(self.connection, ssl.SSLSocket):
                return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
            # An SSLSocket cannot peek, and TLS 1.3 hides a close_notify among application data:
            # read what came. A watch's client sends nothing while it watches, so that is its
            # close_notify or end of stream (b""), or a request it should not have pipelined,
            # which ends the watch as well.
            self.connection.setblocking(False)
            try:
                self.connection.recv(1)
            except ssl.SSLWantReadError:
                return False  # part of a record, or a post-handshake message TLS handled itself
            finally:
                self.connection.setblocking(True)
            return True
        except OSError:
            return True

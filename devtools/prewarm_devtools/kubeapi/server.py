"""The embedded API server: its configuration (identities, access entries, TLS, the version it reports,
injected failures), authentication (bearer tokens to identities), impersonation, RBAC authorization, and
routing: discovery, OpenAPI, version and health here, access reviews (accessreviews.py), the node proxy,
and resource requests (resourcerequests.py). transport.py serves it over HTTP/1.1 on 127.0.0.1 only,
plain or (`tls=True`) HTTPS with a CA made at start.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from prewarm_devtools.kubeapi import errors
from prewarm_devtools.kubeapi.accessreviews import access_review, self_subject_review
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
from prewarm_devtools.kubeapi.errors import StatusError
from prewarm_devtools.kubeapi.kubelet import Kubelets
from prewarm_devtools.kubeapi.openapi import (
    V2_PROTOBUF,
    V2_PROTOBUF_ACCEPTED,
    document,
    index,
    path_of,
    v2_document,
)
from prewarm_devtools.kubeapi.rbac import BOOTSTRAP_POLICY, Attributes, Authorizer, request_attributes
from prewarm_devtools.kubeapi.registry import Registry
from prewarm_devtools.kubeapi.resourcerequests import flag, group_version_of, resolve, serve_collection, serve_item
from prewarm_devtools.kubeapi.resources import REVIEWS
from prewarm_devtools.kubeapi.resources.reviews import SELF_SUBJECT_REVIEWS
from prewarm_devtools.kubeapi.resources.scheduling import SYSTEM_PRIORITY_CLASSES
from prewarm_devtools.kubeapi.resources.types import ResourceType
from prewarm_devtools.kubeapi.seed import load_objects
from prewarm_devtools.kubeapi.store import Store, dumps
from prewarm_devtools.kubeapi.transport import JSON, Handler, HttpServer, Response

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


@dataclass
class _Failure:
    error: StatusError
    remaining: int | None
    method: str | None
    path_prefix: str


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
        self._httpd: HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._silent: socket.socket | None = None  # holds the port while the API hangs
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
        self._release_port()
        self.store.reopen()
        self._httpd = HttpServer(("127.0.0.1", self._port), Handler, self, self._tls_context)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="kubeapi", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: end watches, close every connection, join the threads. The objects stay, and
        `start` serves them again at the same port."""
        self._release_port()
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._port = int(httpd.server_address[1])
        self.store.close()
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        httpd.join_handlers(timeout=5)

    def hang(self) -> None:
        """Stop serving and hold the port in silence: connections are accepted (the kernel's backlog, then
        SYNs dropped) and never answered, as an endpoint whose packets are dropped hangs its clients until
        their own timeouts. `start` serves again at the same port; `stop` makes it refuse."""
        self.stop()
        silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind(("127.0.0.1", self._port))
        silent.listen(128)  # never accepted
        self._silent = silent

    def _release_port(self) -> None:
        """Ends a hang: the connections it held are reset."""
        silent, self._silent = self._silent, None
        if silent is not None:
            silent.close()

    @property
    def state(self) -> str:
        """`serving`, `hung` (connections never answered) or `stopped` (connections refused)."""
        return "serving" if self._httpd is not None else "hung" if self._silent is not None else "stopped"

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
        if self._httpd is None and self._port:
            return self._port  # stopped: where it served, and serves again once started
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

    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> Response:
        """Answer one request; StatusError becomes a Status body."""
        url = urlsplit(raw_path)
        path = "/" + "/".join(unquote(p) for p in url.path.split("/") if p)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            response = self._route(method, path, query, headers, body)
        except StatusError as e:
            response = Response(e.code, dumps(e.status()), headers=e.headers)
        if query.get("pretty") in ("true", "1") and response.stream is None and response.content_type == JSON:
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

    def _route(self, method: str, path: str, query: dict[str, str], headers: Any, body: bytes) -> Response:
        if path in ("/healthz", "/livez", "/readyz"):
            return Response(200, b"ok", "text/plain; charset=utf-8")
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
            response.content_type = V2_PROTOBUF if protobuf else JSON
            return response
        group_version = group_version_of(parts, self.catalog)
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
        target = resolve(rest, served) if rest else None
        if target is None:
            raise errors.route_not_found()
        if target.rtype.name in REVIEWS:
            return access_review(self.registry, self.authorizer, method, target, identity, headers, body)
        if target.rtype is SELF_SUBJECT_REVIEWS:
            return self_subject_review(self.registry, method, target, identity, headers, body)
        watch = legacy_watch or flag(query, "watch")
        if target.name is None:
            return serve_collection(self, method, target, query, headers, body, watch, identity)
        return serve_item(self, method, target, query, headers, body, identity)

    def _node_proxy(self, method: str, name: str, rest: list[str]) -> Response:
        """The node proxy subresource (RBAC `get` on `nodes/proxy`, checked above): the node's kubelet."""
        node = self.get_object("nodes", name)
        if node is None:
            raise errors.not_found("nodes", name)
        code, body, content_type = self.kubelets.proxy(method, node, rest, self.version["gitVersion"])
        return Response(code, body, content_type)

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


def _impersonation(resource: str, name: str, namespace: str = "") -> Attributes:
    return Attributes(
        verb="impersonate", resource_request=True, resource=resource, namespace=namespace, name=name, version="v1"
    )


def _get_only(method: str, body: bytes) -> Response:
    if method != "GET":
        raise errors.method_not_allowed()
    return Response(200, body)



"""The Kubernetes API adapter: the only module of `prewarm` that imports `kubernetes`.

Everything returns the API's JSON as dicts. Typed models are too slow for the hot path (a typed
`list_node()` of 5,000 nodes takes 1.7 s and 370 MB; raw pages of 500 parsed with the garbage
collector paused take ~0.15 s), and importing `kubernetes` costs ~200 ms of cold start, so it is
imported when the first `KubeCluster` is built, never at module import.
"""

from __future__ import annotations

import base64
import binascii
import gc
import json
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from prewarm.adapters.kube_errors import status_error, tls_error, unreachable_reason
from prewarm.services.ports import (
    BearerTokenSource,
    ClusterConfigError,
    ClusterError,
    ClusterExpiredError,
    ClusterInvalidError,
    ClusterNotFoundError,
    ClusterUnavailableError,
)

if TYPE_CHECKING:
    import boto3

    from prewarm.adapters.bounded import BoundedCalls
    from prewarm.domain.clusters import RegisteredCluster
    from prewarm.settings import Settings

__all__ = ["DEFAULT_PAGE_SIZE", "KubeCluster", "KubeObject"]

KubeObject = dict[str, Any]

DEFAULT_PAGE_SIZE = 500
# (connect, read) seconds: a page of 500 nodes is well under a second on a healthy API server.
DEFAULT_REQUEST_TIMEOUT = (5.0, 30.0)
USER_AGENT = "prewarm/0.1"
_JSON = "application/json"
# Metadata only: the API server leaves out spec and status (docs: api-concepts, "Metadata-only fetches";
# served since Kubernetes 1.15). A Node with 50 images is ~15 KB of JSON, its metadata ~2 KB.
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
# Connections kept per host: the sweep reads nodes from a pool of threads (services.budget).
_POOL_CONNECTIONS = 16
_PATCH_CONTENT_TYPES = {True: "application/strategic-merge-patch+json", False: "application/merge-patch+json"}


_IMPORTING = threading.Lock()


def import_kubernetes(*, config: bool = False) -> None:
    """Imports `kubernetes` (its client; with `config`, its kubeconfig loader), one thread at a time.

    Clusters are built side by side (the sweep's and the status path's fan-out over clusters): two threads
    importing the package's circular modules at once deadlock, Python breaks one with `_DeadlockError`,
    and the package stays half-imported for the life of the process (every later build fails).
    """
    with _IMPORTING:
        import kubernetes.client

        if config:
            import kubernetes.config  # noqa: F401


class KubeCluster:
    """The `Cluster` port over the Kubernetes API: nodes, pods, namespaces, secrets, service accounts.

    `token_source` is called before every request (a cached EKS token costs nothing), so expiring
    tokens are replaced without rebuilding the client. `ca_data` is the cluster CA as PEM or base64
    PEM (kubeconfig's `certificate-authority-data`); without it the system CAs are trusted. `name` is the
    cluster's, for messages. Given `bounded`, every call is one try within its short timeouts and the
    invocation's deadline, and none is made while the cluster's circuit is open (`prewarm.adapters.bounded`).
    """

    def __init__(
        self,
        host: str,
        token_source: BearerTokenSource | None = None,
        ca_data: str | None = None,
        verify: bool = True,
        page_size: int = DEFAULT_PAGE_SIZE,
        request_timeout: tuple[float, float] = DEFAULT_REQUEST_TIMEOUT,
        *,
        name: str = "",
        bounded: BoundedCalls | None = None,
    ) -> None:
        import_kubernetes()
        from kubernetes.client.configuration import Configuration

        if not host.startswith(("https://", "http://")):
            raise ClusterConfigError(f"Kubernetes API host {host!r} must be an http:// or https:// URL")
        configuration = Configuration(host=host.rstrip("/"))
        configuration.verify_ssl = verify
        if ca_data:
            # urllib3 takes the PEM itself, so no temporary file is needed.
            configuration.ca_cert_data = ca_pem(ca_data, "ca_data")
        authorization = None if token_source is None else _bearer(token_source)
        self._connect(configuration, authorization, page_size, request_timeout, name=name, bounded=bounded)

    @classmethod
    def from_settings(
        cls, settings: Settings, session: boto3.Session | None = None, page_size: int = DEFAULT_PAGE_SIZE,
        bounded: BoundedCalls | None = None,
    ) -> KubeCluster:
        """The cluster the function's settings name, in this order of precedence.

        `KUBE_API_ENDPOINT` (with `KUBE_CA_DATA`, or the system CAs) and an EKS token for
        `CLUSTER_NAME`; else `KUBECONFIG` (local runs); else the endpoint and CA of EKS cluster
        `CLUSTER_NAME` from `eks:DescribeCluster`, cached for the process.
        """
        from prewarm.adapters.eks_auth import EksTokenSource, describe_cluster_endpoint

        if settings.kube_api_endpoint:
            if not settings.cluster_name:
                raise ClusterConfigError(
                    "KUBE_API_ENDPOINT is set but CLUSTER_NAME is empty: the EKS token names the cluster"
                )
            ca = ca_pem(settings.kube_ca_data, "KUBE_CA_DATA") if settings.kube_ca_data else None
            token = EksTokenSource(settings.cluster_name, session)
            return cls(settings.kube_api_endpoint, token, ca_data=ca, page_size=page_size, name=settings.cluster_name,
                       bounded=bounded)
        if settings.kubeconfig:
            return cls.from_kubeconfig(settings.kubeconfig, page_size=page_size, name=settings.cluster_name,
                                       bounded=bounded)
        if settings.cluster_name:
            endpoint, ca_data = describe_cluster_endpoint(settings.cluster_name, session)
            ca = ca_pem(ca_data, f"certificateAuthority.data of EKS cluster {settings.cluster_name!r}")
            token = EksTokenSource(settings.cluster_name, session)
            return cls(endpoint, token, ca_data=ca, page_size=page_size, name=settings.cluster_name, bounded=bounded)
        raise ClusterConfigError(
            "no Kubernetes API configured: set CLUSTER_NAME (EKS), or KUBE_API_ENDPOINT and CLUSTER_NAME, "
            "or KUBECONFIG for local runs"
        )

    @classmethod
    def for_registered(
        cls, cluster: RegisteredCluster, session: boto3.Session | None = None, page_size: int = DEFAULT_PAGE_SIZE,
        bounded: BoundedCalls | None = None,
    ) -> KubeCluster:
        """A registered cluster's API: the endpoint and CA `prewarm cluster add` read from EKS, and an EKS
        token for its name, signed with this process's credentials (its access entry names the role)."""
        from prewarm.adapters.eks_auth import EksTokenSource

        if not cluster.endpoint:
            raise ClusterConfigError(f"cluster {cluster.name!r} has no API endpoint: add it again")
        ca = ca_pem(cluster.ca_data, f"the CA of cluster {cluster.name!r}") if cluster.ca_data else None
        return cls(cluster.endpoint, EksTokenSource(cluster.name, session), ca_data=ca, page_size=page_size,
                   name=cluster.name, bounded=bounded)

    @classmethod
    def from_kubeconfig(
        cls, path: str, context: str | None = None, page_size: int = DEFAULT_PAGE_SIZE, *, name: str = "",
        bounded: BoundedCalls | None = None,
    ) -> KubeCluster:
        """The cluster of a kubeconfig file (or `:`-separated files): its server, CA, token or client cert.

        Tokens from `exec` plugins (such as `aws eks get-token`) are refreshed when they expire.
        """
        import_kubernetes(config=True)
        from kubernetes.client.configuration import Configuration
        from kubernetes.config import kube_config
        from kubernetes.config.config_exception import ConfigException

        configuration = Configuration()
        try:
            loader: Any = kube_config
            loader.load_kube_config(
                config_file=path, context=context, client_configuration=configuration, persist_config=False
            )
        except (ConfigException, OSError, ValueError, KeyError) as e:
            raise ClusterConfigError(f"KUBECONFIG {path!r} cannot be used: {e}") from e

        def authorization() -> str | None:
            # The loader keeps the whole header value ("Bearer ..."); its hook re-runs exec plugins.
            value: str | None = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
            return value

        self = cls.__new__(cls)
        self._connect(configuration, authorization, page_size, DEFAULT_REQUEST_TIMEOUT, name=name, bounded=bounded)
        return self

    def _connect(
        self,
        configuration: Any,
        authorization: Callable[[], str | None] | None,
        page_size: int,
        request_timeout: tuple[float, float],
        *,
        name: str = "",
        bounded: BoundedCalls | None = None,
    ) -> None:
        import urllib3
        from kubernetes.client.api_client import ApiClient
        from kubernetes.client.exceptions import ApiException

        if page_size < 1:
            raise ClusterConfigError(f"page_size must be at least 1, got {page_size}")
        # Retry only what never reached the server (and one read of a GET). urllib3's default would
        # also sleep out every Retry-After of a 429 or 503, unbounded, inside the function's time
        # limit: those become ClusterUnavailableError with retry_after, for the caller to schedule.
        configuration.retries = urllib3.util.Retry(
            total=3, connect=3, read=1, status=0, other=0, backoff_factor=0.1, respect_retry_after_header=False
        ) if bounded is None else urllib3.util.Retry(  # one try: a cluster that fails is skipped a while
            total=0, connect=0, read=0, redirect=0, status=0, other=0, respect_retry_after_header=False)
        if bounded is not None:
            request_timeout = bounded.timeout
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, _POOL_CONNECTIONS)
        self.host: str = configuration.host
        self.name = name
        self._bounded = bounded
        self.page_size = page_size
        self._authorization = authorization
        self._timeout = request_timeout
        self._client: Any = ApiClient(configuration)
        self._api_exception: Any = ApiException
        self._transport_error: type[Exception] = urllib3.exceptions.HTTPError
        self._ssl_error: type[Exception] = urllib3.exceptions.SSLError

    @property
    def who(self) -> str:
        """The cluster as messages name it."""
        return f"cluster {self.name}" if self.name else f"the Kubernetes API at {self.host}"

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()

    def __enter__(self) -> KubeCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KubeCluster(host={self.host!r}, page_size={self.page_size}, bounded={self._bounded is not None})"

    # -- the Cluster port ---------------------------------------------------------------------------

    def list_nodes(
        self, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[KubeObject]:
        """All nodes matching the selectors (evaluated by the API server), across every page."""
        return self._list("/api/v1/nodes", label_selector, field_selector)

    def get_node(self, name: str) -> KubeObject | None:
        """The node called `name`, or None when there is none."""
        return self._get(f"/api/v1/nodes/{_segment(name)}")

    def list_node_metadata(self) -> list[KubeObject]:
        """Every node's metadata alone (`PartialObjectMetadata` items: name, uid, labels, annotations,
        creationTimestamp), across every page: what the sweep needs of 5,000 nodes without their status."""
        return self._list("/api/v1/nodes", None, None, accept=_METADATA_LIST, project=_metadata_only)

    def get_node_metadata(self, name: str) -> KubeObject | None:
        """The metadata of node `name` (a `PartialObjectMetadata`), or None when there is none."""
        return self._get(f"/api/v1/nodes/{_segment(name)}", accept=_METADATA)

    def list_pods(
        self, namespace: str | None, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[KubeObject]:
        """The pods of `namespace` (all namespaces when None) matching the selectors."""
        path = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{_segment(namespace)}/pods"
        return self._list(path, label_selector, field_selector)

    def list_namespaces(self, label_selector: str | None = None) -> list[KubeObject]:
        """The namespaces matching `label_selector`."""
        return self._list("/api/v1/namespaces", label_selector, None)

    def get_secret(self, namespace: str, name: str) -> KubeObject | None:
        """The secret, or None when it (or its namespace) does not exist."""
        return self._get(_namespaced(namespace, "secrets", name))

    def create_secret(self, namespace: str, body: Mapping[str, Any]) -> KubeObject:
        """Create a secret; `ClusterConflictError` (reason `AlreadyExists`) when the name is taken."""
        return self._request("POST", _namespaced(namespace, "secrets"), body=dict(body))

    def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> KubeObject:
        """Replace a secret; a stale `metadata.resourceVersion` in `body` raises `ClusterConflictError`."""
        return self._request("PUT", _namespaced(namespace, "secrets", name), body=dict(body))

    def get_service_account(self, namespace: str, name: str) -> KubeObject | None:
        """The service account, or None when it (or its namespace) does not exist."""
        return self._get(_namespaced(namespace, "serviceaccounts", name))

    def patch_service_account(
        self, namespace: str, name: str, patch: Mapping[str, Any], strategic: bool = True
    ) -> KubeObject:
        """Patch a service account with a strategic merge patch or, with `strategic=False`, a JSON merge patch.

        Only lists with a merge key merge strategically (`secrets`, by name); a ServiceAccount's
        `imagePullSecrets` has none, so either patch replaces it: send the whole list.
        """
        return self._request(
            "PATCH",
            _namespaced(namespace, "serviceaccounts", name),
            body=dict(patch),
            content_type=_PATCH_CONTENT_TYPES[strategic],
        )

    def patch_node(self, name: str, ops: Sequence[Mapping[str, Any]]) -> KubeObject:
        """A JSON patch of the node (its `test` ops make a stale patch fail with 422, `ClusterInvalidError`)."""
        return self._request("PATCH", f"/api/v1/nodes/{_segment(name)}", body=[dict(op) for op in ops],
                             content_type="application/json-patch+json")

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> KubeObject:
        """A strategic merge patch of the node's status subresource: conditions merge by `type`, so the
        kubelet's own conditions are left as they are."""
        return self._request("PATCH", f"/api/v1/nodes/{_segment(name)}/status", body=dict(patch),
                             content_type="application/strategic-merge-patch+json")

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> KubeObject:
        return self._request("POST", _namespaced(namespace, "events"), body=dict(body))

    def get_node_configz(self, name: str) -> KubeObject:
        """The node's kubelet configuration, `{"kubeletconfig": {...}}`, through the API server's node proxy.

        The API server authorizes it as `get` on `nodes/proxy` (403 `ClusterAuthError` without); a kubelet
        it cannot reach answers 5xx (`ClusterUnavailableError`), a missing node 404 (`ClusterNotFoundError`).
        """
        return self._request("GET", f"/api/v1/nodes/{_segment(name)}/proxy/configz")

    # -- any object, by API version and plural (install, doctor) ------------------------------------

    def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> KubeObject | None:
        """The object, or None when it (or its namespace) does not exist."""
        return self._get(object_path(api_version, plural, namespace, name))

    def list_objects(
        self, api_version: str, plural: str, namespace: str | None = None, label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[KubeObject]:
        """The objects of a type (in `namespace`, or cluster-wide) matching the selectors, every page."""
        return self._list(object_path(api_version, plural, namespace), label_selector, field_selector)

    def create_object(
        self, api_version: str, plural: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> KubeObject:
        """Create an object (also a review: SubjectAccessReview answers in the returned object)."""
        return self._request("POST", object_path(api_version, plural, namespace), body=dict(body))

    def replace_object(
        self, api_version: str, plural: str, name: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> KubeObject:
        """Replace an object; a stale `metadata.resourceVersion` raises `ClusterConflictError`."""
        return self._request("PUT", object_path(api_version, plural, namespace, name), body=dict(body))

    def replace_status(
        self, api_version: str, plural: str, name: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> KubeObject:
        """Replace an object's status subresource; a stale `metadata.resourceVersion` raises `ClusterConflictError`."""
        return self._request("PUT", object_path(api_version, plural, namespace, name) + "/status", body=dict(body))

    def delete_object(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> bool:
        """Delete an object (its dependents in the background); False when it was not there."""
        try:
            self._request("DELETE", object_path(api_version, plural, namespace, name),
                          body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
        except ClusterNotFoundError:
            return False
        return True

    # -- HTTP ----------------------------------------------------------------------------------------

    def _get(self, path: str, accept: str = _JSON) -> KubeObject | None:
        try:
            return self._request("GET", path, accept=accept)
        except ClusterNotFoundError:
            return None

    def _list(
        self, path: str, label_selector: str | None, field_selector: str | None, accept: str = _JSON,
        project: Callable[[KubeObject], KubeObject] | None = None,
    ) -> list[KubeObject]:
        query: dict[str, str | int] = {"limit": self.page_size}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        items: list[KubeObject] = []
        token = ""
        restarted = False
        while True:
            page_query = {**query, "continue": token} if token else query
            try:
                page = self._request("GET", path, page_query, accept=accept)
            except ClusterExpiredError:
                # The API server expires continue tokens after ~5 minutes; a consistent list needs a restart.
                if not token or restarted:
                    raise
                restarted, items, token = True, [], ""
                continue
            page_items = page.get("items") or ()
            items.extend(page_items if project is None else map(project, page_items))
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    def _request(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int] | None = None,
        body: KubeObject | list[KubeObject] | None = None,
        content_type: str = _JSON,
        accept: str = _JSON,
    ) -> KubeObject:
        if self._bounded is None:
            return self._send(method, path, query, body, content_type, accept, self._timeout)
        timeout = self._bounded.before(self.host, self.who, f"{method} {path}")
        try:
            answer = self._send(method, path, query, body, content_type, accept, timeout)
        except ClusterError as e:
            self._bounded.breakers.failed(self.host, e)
            raise
        self._bounded.breakers.answered(self.host)
        return answer

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int] | None,
        body: KubeObject | list[KubeObject] | None,
        content_type: str,
        accept: str,
        timeout: tuple[float, float],
    ) -> KubeObject:
        url = self.host + path
        if query:
            url += "?" + urlencode(query, quote_via=quote)
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        if self._authorization is not None:
            value = self._authorization()
            if value:
                headers["Authorization"] = value
        if body is not None:
            headers["Content-Type"] = content_type
        what = f"{method} {path}"
        try:
            response: Any = self._client.call_api(
                method, url, header_params=headers, body=body, _request_timeout=timeout
            )
            try:
                data: bytes = response.read()
            finally:
                response.response.release_conn()
        except self._api_exception as e:
            # The client reports TLS failures as a status-0 ApiException.
            raise tls_error(self.host, what, e) from e
        except self._transport_error as e:
            # With retries configured, urllib3 wraps a failed TLS verification in MaxRetryError.
            reason = getattr(e, "reason", None)
            if isinstance(reason, self._ssl_error):
                raise tls_error(self.host, what, reason) from e
            raise ClusterUnavailableError(
                f"{self.who} cannot be reached: {unreachable_reason(e, timeout)} ({method} {self.host}{path})"
            ) from e
        if not 200 <= response.status <= 299:
            raise status_error(response.status, data, response.headers, what) from self._api_exception(
                http_resp=response
            )
        parsed = _parse_json(data)
        if not isinstance(parsed, dict):
            raise ClusterError(f"{what}: the API answered {type(parsed).__name__}, not a JSON object")
        return parsed


def _metadata_only(item: KubeObject) -> KubeObject:
    # A server (or proxy) that ignored the metadata-only Accept sent whole objects: keep one page of them at most.
    return item if set(item) <= {"kind", "apiVersion", "metadata"} else {"metadata": item.get("metadata") or {}}


def ca_pem(ca_data: str, parameter: str) -> str:
    """The PEM text of `ca_data` (PEM, or base64 of PEM as in kubeconfig), checked to hold certificates.

    `ClusterConfigError` names `parameter` when the data is not a usable CA bundle.
    """
    text = ca_data.strip()
    if not text.startswith("-----BEGIN"):
        try:
            text = base64.b64decode(text, validate=True).decode("ascii")
        except (binascii.Error, ValueError) as e:
            raise ClusterConfigError(f"{parameter} is not base64-encoded PEM: {e}") from e
    try:
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as e:
        raise ClusterConfigError(f"{parameter} holds no valid PEM CA certificate: {e}") from e
    return text


def _bearer(token_source: BearerTokenSource) -> Callable[[], str]:
    def authorization() -> str:
        return f"Bearer {token_source()}"

    return authorization


def _segment(value: str) -> str:
    if not value:
        raise ClusterInvalidError("a Kubernetes object name or namespace is empty")
    return quote(value, safe="")


def object_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None) -> str:
    """`/api/v1/...` or `/apis/<group>/<version>/...`, namespaced when `namespace` is given."""
    root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{root}/namespaces/{_segment(namespace)}/{plural}" if namespace else f"{root}/{plural}"
    return path if name is None else f"{path}/{_segment(name)}"


def _namespaced(namespace: str, resource: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{_segment(namespace)}/{resource}"
    return path if name is None else f"{path}/{_segment(name)}"


def _parse_json(data: bytes) -> Any:
    # Parsing thousands of small dicts triggers many useless collections; pause them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(data)
    except ValueError as e:
        raise ClusterError(f"the Kubernetes API answered something that is not JSON: {data[:120]!r}") from e
    finally:
        if enabled:
            gc.enable()

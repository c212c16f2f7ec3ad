"""The layers a pull will download, read from the registry's manifest with the pull's own credentials.

Registries are reached the way the node's containerd reaches them: its per-registry `hosts.toml`
(`<config_path>/<host>/hosts.toml`, mirrors first, then `server`) when one exists, else
`https://<host>` (Docker Hub at `registry-1.docker.io`; loopback hosts over plain http as a fallback).
Token auth follows the registry's `WWW-Authenticate` challenge (Basic, or a Bearer token fetched from
its realm with the same credentials). An index is resolved to this node's platform.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import ssl
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prewarm.domain.images import DEFAULT_REGISTRY, DEFAULT_TAG, ImageRef
from prewarm.domain.placement import Platform
from prewarm.domain.registries import RegistryAuth
from prewarm_agent.node import local_architecture

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
DOCKER_HUB_ENDPOINT = "https://registry-1.docker.io"
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
_MAX_MANIFEST_BYTES = 4 * 1024 * 1024


class ManifestError(Exception):
    """The manifest could not be read; progress then falls back to what containerd shows."""


def this_machine() -> Platform:
    """The platform containerd on this machine pulls for."""
    arch = local_architecture()
    return Platform("linux", arch, "v8" if arch == "arm64" else None)


@dataclass(frozen=True)
class Endpoint:
    """Where to ask for a registry's manifests: a base URL, and whether to skip TLS verification."""

    url: str
    skip_verify: bool = False


def _is_loopback(host: str) -> bool:
    name = urllib.parse.urlsplit(f"//{host}").hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _default_server(host: str) -> str:
    return DOCKER_HUB_ENDPOINT if host == DEFAULT_REGISTRY else f"https://{host}"


def registry_endpoints(host: str, config_path: str | None = None) -> list[Endpoint]:
    """The endpoints containerd would resolve `host`'s manifests at, in the order it tries them."""
    hosts_toml = Path(config_path, host, "hosts.toml") if config_path else None
    if hosts_toml is None or not hosts_toml.is_file():
        default = [Endpoint(_default_server(host))]
        return [*default, Endpoint(f"http://{host}")] if _is_loopback(host) else default
    try:
        config = tomllib.loads(hosts_toml.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ManifestError(f"cannot read {hosts_toml}: {e}") from e
    endpoints = []
    for url, table in (config.get("host") or {}).items():
        capabilities = table.get("capabilities", ["pull", "resolve"])
        if "resolve" in capabilities:
            endpoints.append(Endpoint(url.rstrip("/"), bool(table.get("skip_verify", False))))
    server = str(config.get("server") or _default_server(host)).rstrip("/")
    if "resolve" in config.get("capabilities", ["pull", "resolve"]):
        endpoints.append(Endpoint(server, bool(config.get("skip_verify", False))))
    return endpoints


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(_CHALLENGE_PARAM.findall(rest))


class ManifestResolver:
    """Reads the layers (digest → compressed size) of an image for `platform`."""

    def __init__(
        self,
        config_path: str | None = None,
        platform: Platform | None = None,
        timeout: float = 10.0,
        fetch: Callable[[Endpoint], Fetch] | None = None,
    ) -> None:
        self.config_path = config_path
        self.platform = platform or this_machine()
        self.timeout = timeout
        self._fetch = fetch or (lambda endpoint: HttpFetch(endpoint, timeout))

    def layers(self, image: ImageRef, auth: RegistryAuth | None) -> dict[str, int]:
        """The layers a pull of `image` downloads; raises `ManifestError` when they cannot be read."""
        problems = []
        for endpoint in registry_endpoints(image.registry, self.config_path):
            session = _Session(endpoint, auth, self._fetch(endpoint))
            try:
                return self._layers(session, image)
            except ManifestError as e:
                problems.append(f"{endpoint.url}: {e}")
        raise ManifestError(f"manifest of {image} not readable: {'; '.join(problems) or 'no endpoint'}")

    def _layers(self, session: _Session, image: ImageRef) -> dict[str, int]:
        reference = image.digest or image.tag or DEFAULT_TAG
        document = session.manifest(image.repository, reference)
        if "manifests" in document:
            chosen = next(
                (item for item in document["manifests"] if self.platform.matches(item.get("platform") or {})), None
            )
            if chosen is None:
                raise ManifestError(f"index has no manifest for {self.platform.os}/{self.platform.architecture}")
            document = session.manifest(image.repository, str(chosen["digest"]))
        if "layers" not in document:
            raise ManifestError(f"unsupported manifest (schemaVersion {document.get('schemaVersion')})")
        return {str(layer["digest"]): int(layer.get("size") or 0) for layer in document["layers"]}


Fetch = Callable[[str, Mapping[str, str]], tuple[int, Mapping[str, str], bytes]]
"""GET `url` with `headers`: (status, headers with lower-case names, body); `ManifestError` when unreachable."""


def _lower(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers}


class HttpFetch:
    """`Fetch` over urllib, for one endpoint's TLS settings."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        context = ssl.create_default_context()
        if endpoint.skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))

    def __call__(self, url: str, headers: Mapping[str, str]) -> tuple[int, Mapping[str, str], bytes]:
        request = urllib.request.Request(url, headers=dict(headers))
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return int(response.status), _lower(response.headers.items()), response.read(_MAX_MANIFEST_BYTES)
        except urllib.error.HTTPError as e:
            return int(e.code), _lower(e.headers.items()), b""
        except (OSError, ValueError) as e:
            # URLError, timeouts and TLS failures; the text never holds credentials.
            raise ManifestError(str(getattr(e, "reason", e))) from e


class _Session:
    """Requests to one registry endpoint, answering its auth challenge once."""

    def __init__(self, endpoint: Endpoint, auth: RegistryAuth | None, fetch: Fetch) -> None:
        self.endpoint = endpoint
        self.auth = auth
        self.authorization: str | None = None
        self._open = fetch

    def _basic(self) -> str | None:
        if self.auth is None:
            return None
        return "Basic " + base64.b64encode(f"{self.auth.username}:{self.auth.password}".encode()).decode()

    def manifest(self, repository: str, reference: str) -> dict[str, Any]:
        base = self.endpoint.url if self.endpoint.url.endswith("/v2") else f"{self.endpoint.url}/v2"
        url = f"{base}/{repository}/manifests/{reference}"
        status, response_headers, body = self._get(url)
        if status == 401 and self.authorization is None:
            # The registry's challenge says how to authenticate: answer it, then ask once more.
            self.authorization = self._answer(response_headers.get("www-authenticate", ""))
            status, _, body = self._get(url)
        if status != 200:
            raise ManifestError(f"registry answered {status} for {repository}:{reference}")
        try:
            document: dict[str, Any] = json.loads(body)
        except ValueError as e:
            raise ManifestError(f"manifest of {repository}:{reference} is not JSON") from e
        return document

    def _get(self, url: str) -> tuple[int, Mapping[str, str], bytes]:
        headers = {"Accept": _ACCEPT}
        if self.authorization:
            headers["Authorization"] = self.authorization
        return self._open(url, headers)

    def _answer(self, header: str) -> str:
        scheme, params = _challenge(header)
        basic = self._basic()
        if scheme == "basic":
            if basic is None:
                raise ManifestError("registry needs credentials and none apply")
            return basic
        if scheme != "bearer" or "realm" not in params:
            raise ManifestError(f"unsupported auth challenge {scheme or 'none'!r}")
        query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
        headers = {"Authorization": basic} if basic else {}
        status, _, body = self._open(f"{params['realm']}?{query}", headers)
        if status != 200:
            raise ManifestError(f"token endpoint answered {status}")
        try:
            token = json.loads(body)
            return "Bearer " + str(token.get("token") or token["access_token"])
        except (ValueError, KeyError) as e:
            raise ManifestError("token endpoint answered without a token") from e

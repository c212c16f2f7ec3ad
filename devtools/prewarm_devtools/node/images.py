"""Small OCI images built in pure Python and pushed with the distribution HTTP API.

An image is one gzip layer (given files, and/or ``size_mb`` of random bytes that do not compress, for
slow pulls), an OCI config and an OCI manifest; an index groups images of several platforms.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import hashlib
import http.client
import io
import json
import os
import platform
import tarfile
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"

_GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def host_architecture() -> str:
    """This machine's architecture in OCI (Go) terms: ``amd64``, ``arm64``, ..."""
    machine = platform.machine().lower()
    return _GO_ARCH.get(machine, machine)


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Blob:
    """Bytes stored in a registry under their digest."""

    media_type: str
    data: bytes = field(repr=False)

    @property
    def digest(self) -> str:
        return sha256_digest(self.data)

    @property
    def size(self) -> int:
        return len(self.data)

    def descriptor(self, **extra: object) -> dict[str, object]:
        """The OCI descriptor pointing at this blob."""
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size, **extra}


@dataclass(frozen=True)
class Layer:
    """A gzip-compressed layer tar; ``diff_id`` is the digest of the uncompressed tar."""

    blob: Blob
    diff_id: str


@dataclass(frozen=True)
class OciImage:
    """One platform's image: its manifest, config and layers."""

    architecture: str
    os: str
    config: Blob
    layers: tuple[Layer, ...]
    manifest: Blob

    @property
    def total_size(self) -> int:
        """Bytes a pull downloads: manifest, config and compressed layers."""
        return self.manifest.size + self.config.size + sum(layer.blob.size for layer in self.layers)


@dataclass(frozen=True)
class OciIndex:
    """A multi-platform image: an index whose entries are per-platform manifests."""

    images: tuple[OciImage, ...]
    index: Blob


def build_layer(
    files: Mapping[str, bytes] | None = None, size_mb: float = 0.0, compresslevel: int | None = None
) -> Layer:
    """A layer with ``files`` ({path: content}) plus, if ``size_mb``, a file of that many random MiB.

    Random bytes stay the same size after gzip, so ``size_mb`` is also about the download size.
    """
    entries = dict(files or {})
    if size_mb > 0:
        entries["prewarm/random.bin"] = os.urandom(int(size_mb * 1024 * 1024))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directories: set[str] = set()
        for path in sorted(entries):
            parts = path.strip("/").split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in directories:
                    directories.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode = len(entries[path]), 0o644
            tar.addfile(info, io.BytesIO(entries[path]))
    uncompressed = raw.getvalue()
    # Random data does not compress; level 1 saves time on big layers.
    level = compresslevel if compresslevel is not None else (1 if size_mb > 0 else 6)
    compressed = gzip.compress(uncompressed, compresslevel=level, mtime=0)
    return Layer(blob=Blob(OCI_LAYER_GZIP, compressed), diff_id=sha256_digest(uncompressed))


def build_image(
    files: Mapping[str, bytes] | None = None,
    size_mb: float = 0.0,
    architecture: str | None = None,
    os_name: str = "linux",
    layers: Sequence[Layer] | None = None,
) -> OciImage:
    """An image for ``os_name``/``architecture`` (default: this machine's) with one layer built from
    ``files`` and ``size_mb``, or the given ``layers``. Each call's config is unique, so two images
    built alike still have different ids.
    """
    architecture = architecture or host_architecture()
    if layers is None:
        default_files = {"etc/prewarm-release": f"{os_name}/{architecture}\n".encode()}
        layers = [build_layer(files if files is not None else default_files, size_mb)]
    config = {
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "architecture": architecture,
        "os": os_name,
        "config": {"Cmd": ["/bin/true"], "Labels": {"dev.prewarm.test.nonce": uuid.uuid4().hex}},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created_by": "prewarm_devtools.node.images"} for _ in layers],
    }
    config_blob = Blob(OCI_CONFIG, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config_blob.descriptor(),
        "layers": [layer.blob.descriptor() for layer in layers],
    }
    return OciImage(
        architecture=architecture,
        os=os_name,
        config=config_blob,
        layers=tuple(layers),
        manifest=Blob(OCI_MANIFEST, json.dumps(manifest, sort_keys=True).encode()),
    )


def build_index(images: Sequence[OciImage]) -> OciIndex:
    """An OCI index listing each image's manifest with its platform."""
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            image.manifest.descriptor(platform={"architecture": image.architecture, "os": image.os}) for image in images
        ],
    }
    return OciIndex(images=tuple(images), index=Blob(OCI_INDEX, json.dumps(index, sort_keys=True).encode()))


class RegistryPushError(RuntimeError):
    """The registry refused a push; the message has the status and the registry's error body."""


@dataclass(frozen=True)
class PushedImage:
    """What a push stored: pull ``reference`` (by tag) or ``digest_reference`` (by digest)."""

    registry_host: str
    repository: str
    tag: str
    digest: str
    manifest_digest: str
    index_digest: str | None
    config_digest: str
    layer_digests: tuple[str, ...]
    layer_sizes: tuple[int, ...]
    total_size: int

    @property
    def reference(self) -> str:
        return f"{self.registry_host}/{self.repository}:{self.tag}"

    @property
    def digest_reference(self) -> str:
        return f"{self.registry_host}/{self.repository}@{self.digest}"

    def with_host(self, host: str) -> PushedImage:
        """The same image named under another host (a mirror or proxy serving this registry)."""
        return dataclasses.replace(self, registry_host=host)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class RegistryPusher:
    """Pushes blobs and manifests to ``base_url`` (``http://127.0.0.1:<port>``).

    Answers a 401 challenge as the registry asks: HTTP Basic with ``auth``, or, for a ``Bearer``
    challenge, a token fetched from the realm with the same credentials. With ``chunk_size`` blobs go
    up in PATCH chunks, otherwise in one PUT.
    """

    def __init__(self, base_url: str, auth: tuple[str, str] | None = None, chunk_size: int | None = None) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"base_url must look like http://127.0.0.1:<port>, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.host = parsed.netloc
        self.auth = auth
        self.chunk_size = chunk_size
        self._authorization: str | None = None

    def _send(
        self, method: str, url: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        target = urllib.parse.urljoin(self.base_url + "/", url)
        parts = urllib.parse.urlsplit(target)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        all_headers = {"Content-Length": str(len(body)), **(headers or {})}
        if self._authorization:
            all_headers["Authorization"] = self._authorization
        connection = http.client.HTTPConnection(parts.netloc, timeout=60)
        try:
            connection.request(method, path, body=body, headers=all_headers)
            response = connection.getresponse()
            return response.status, response.headers, response.read()
        finally:
            connection.close()

    def _request(
        self, method: str, url: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        status, response_headers, response_body = self._send(method, url, body, headers)
        if status == 401 and self.auth is not None:
            self._answer_challenge(response_headers.get("WWW-Authenticate", ""))
            status, response_headers, response_body = self._send(method, url, body, headers)
        return status, response_headers, response_body

    def _answer_challenge(self, challenge: str) -> None:
        assert self.auth is not None
        scheme, _, params_text = challenge.partition(" ")
        basic = "Basic " + base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
        if scheme.lower() == "basic":
            self._authorization = basic
            return
        if scheme.lower() != "bearer":
            raise RegistryPushError(f"registry {self.host} asks for unsupported auth {challenge!r}")
        params = dict(
            (key.strip(), value.strip().strip('"'))
            for key, _, value in (item.partition("=") for item in params_text.split(","))
        )
        query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
        request = urllib.request.Request(f"{params['realm']}?{query}", headers={"Authorization": basic})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
        with opener.open(request, timeout=30) as response:
            token = json.loads(response.read())
        self._authorization = "Bearer " + (token.get("token") or token["access_token"])

    @staticmethod
    def _expect(status: int, expected: int, body: bytes, action: str) -> None:
        if status != expected:
            raise RegistryPushError(f"{action}: registry answered {status}: {body.decode(errors='replace')[:500]}")

    def blob_exists(self, repository: str, digest: str) -> bool:
        """True when the registry already has the blob in ``repository``."""
        status, _, _ = self._request("HEAD", f"/v2/{repository}/blobs/{digest}")
        return status == 200

    def push_blob(self, repository: str, blob: Blob) -> str:
        """Upload ``blob`` unless present; returns its digest."""
        if self.blob_exists(repository, blob.digest):
            return blob.digest
        status, headers, body = self._request("POST", f"/v2/{repository}/blobs/uploads/")
        self._expect(status, 202, body, f"starting upload of {blob.digest} to {repository}")
        location = headers["Location"]
        data = blob.data
        if self.chunk_size:
            for start in range(0, len(data), self.chunk_size):
                chunk = data[start : start + self.chunk_size]
                status, headers, body = self._request(
                    "PATCH",
                    location,
                    chunk,
                    {
                        "Content-Type": "application/octet-stream",
                        "Content-Range": f"{start}-{start + len(chunk) - 1}",
                    },
                )
                self._expect(status, 202, body, f"uploading bytes {start}+ of {blob.digest}")
                location = headers["Location"]
            data = b""
        separator = "&" if "?" in location else "?"
        status, _, body = self._request(
            "PUT",
            f"{location}{separator}digest={urllib.parse.quote(blob.digest)}",
            data,
            {"Content-Type": "application/octet-stream"},
        )
        self._expect(status, 201, body, f"finishing upload of {blob.digest} to {repository}")
        return blob.digest

    def push_manifest(self, repository: str, reference: str, manifest: Blob) -> str:
        """PUT a manifest or index under a tag or digest; returns the digest the registry reports."""
        status, headers, body = self._request(
            "PUT",
            f"/v2/{repository}/manifests/{reference}",
            manifest.data,
            {"Content-Type": manifest.media_type},
        )
        self._expect(status, 201, body, f"pushing manifest {repository}:{reference}")
        digest = headers.get("Docker-Content-Digest", manifest.digest)
        if digest != manifest.digest:
            raise RegistryPushError(f"registry stored {repository}:{reference} as {digest}, not {manifest.digest}")
        return digest

    def _push_platform_image(self, repository: str, image: OciImage, reference: str) -> None:
        for layer in image.layers:
            self.push_blob(repository, layer.blob)
        self.push_blob(repository, image.config)
        self.push_manifest(repository, reference, image.manifest)

    def _pushed(self, repository: str, tag: str, image: OciImage, index: Blob | None = None) -> PushedImage:
        return PushedImage(
            registry_host=self.host,
            repository=repository,
            tag=tag,
            digest=(index or image.manifest).digest,
            manifest_digest=image.manifest.digest,
            index_digest=index.digest if index is not None else None,
            config_digest=image.config.digest,
            layer_digests=tuple(layer.blob.digest for layer in image.layers),
            layer_sizes=tuple(layer.blob.size for layer in image.layers),
            total_size=image.total_size + (index.size if index is not None else 0),
        )

    def push_image(self, repository: str, tag: str, image: OciImage) -> PushedImage:
        """Push a single-platform image under ``tag``."""
        self._push_platform_image(repository, image, tag)
        return self._pushed(repository, tag, image)

    def push_index(self, repository: str, tag: str, index: OciIndex) -> PushedImage:
        """Push every platform's image by digest, then the index under ``tag``.

        The result describes the image matching this machine's architecture when the index has one
        (what a pull here gets), else the first.
        """
        for image in index.images:
            self._push_platform_image(repository, image, image.manifest.digest)
        self.push_manifest(repository, tag, index.index)
        local = next((i for i in index.images if i.architecture == host_architecture()), index.images[0])
        return self._pushed(repository, tag, local, index.index)

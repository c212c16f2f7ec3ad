"""A local OCI registry: the CNCF distribution registry (Debian's docker-registry) on 127.0.0.1."""

from __future__ import annotations

import http.client
import secrets
import shutil
from pathlib import Path
from typing import Self

import bcrypt

from prewarm_devtools.node.ecr_front import Check, RegistryFront
from prewarm_devtools.node.process import DaemonProcess, DaemonStartError, LoopbackEndpoint, free_port

REGISTRY_BINARY = "/usr/bin/docker-registry"
HTPASSWD_REALM = "prewarm-local"


def registry_binary() -> str | None:
    """Path of the registry binary, or None when it is not installed."""
    return shutil.which("docker-registry") or (REGISTRY_BINARY if Path(REGISTRY_BINARY).exists() else None)


class LocalRegistry(LoopbackEndpoint):
    """A registry storing blobs under ``base_dir``, with deletes enabled.

    With ``htpasswd_users`` ({username: password}) every request needs HTTP Basic auth, as a
    private registry does; anonymous and wrong credentials get 401 Unauthorized.

    With ``door`` (see `RegistryFront`), the registry is served on ``port`` through a front that asks
    ``door`` about every request, as ECR decides each by its token; docker-registry itself listens on
    ``upstream_port`` with one user of the front's own. ``auth`` is then ``client_auth``, what clients
    here (pushes, direct pulls) present, and ``realm`` the host the front's 401 challenge names.
    """

    def __init__(
        self, base_dir: Path, htpasswd_users: dict[str, str] | None = None, start_timeout: float = 15.0, *,
        door: Check | None = None, client_auth: tuple[str, str] | None = None, realm: str = "127.0.0.1",
    ) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.door = door
        self._client_auth = client_auth
        self.realm = realm
        self.front: RegistryFront | None = None
        self.upstream_port = 0
        if door is not None:
            htpasswd_users = {"front": secrets.token_urlsafe(24)}
        self.htpasswd_users = dict(htpasswd_users or {})
        self.start_timeout = start_timeout
        self.config_path = self.base_dir / "config.yml"
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "registry.log"
        self.port = 0
        self._daemon: DaemonProcess | None = None

    @property
    def auth(self) -> tuple[str, str] | None:
        """What clients present: ``client_auth`` behind a door, else the first configured (username,
        password), or None for an open registry."""
        if self.door is not None:
            return self._client_auth
        return next(iter(self.htpasswd_users.items()), None)

    @property
    def pid(self) -> int | None:
        """PID of the running registry, None when stopped."""
        return self._daemon.pid if self._daemon is not None else None

    @property
    def start_time(self) -> int | None:
        """The running registry's start time (see ``process_start_time``), None when stopped."""
        return self._daemon.start_time if self._daemon is not None else None

    def _write_config(self) -> None:
        auth = ""
        if self.htpasswd_users:
            htpasswd = self.base_dir / "htpasswd"
            htpasswd.write_text(
                "".join(
                    f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
                    for user, password in self.htpasswd_users.items()
                ),
                encoding="utf-8",
            )
            auth = f"auth:\n  htpasswd:\n    realm: {HTPASSWD_REALM}\n    path: {htpasswd}\n"
        self.config_path.write_text(
            "version: 0.1\n"
            "log:\n  level: info\n"
            "storage:\n"
            f"  filesystem:\n    rootdirectory: {self.data_dir}\n"
            "  delete:\n    enabled: true\n"
            "  maintenance:\n    uploadpurging:\n      enabled: false\n"
            "http:\n"
            f"  addr: 127.0.0.1:{self.upstream_port}\n"
            f"  secret: {secrets.token_hex(16)}\n" + auth,
            encoding="utf-8",
        )

    def _answers(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=1)
        try:
            connection.request("GET", "/v2/")
            status = connection.getresponse().status
        except OSError:
            return False
        finally:
            connection.close()
        return status in (200, 401)

    def start(self) -> Self:
        """Start on a free port and wait until ``/v2/`` answers."""
        binary = registry_binary()
        if binary is None:
            raise DaemonStartError("docker-registry is not installed; run `make node-deps` as root")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The port is picked before the registry binds it; another process may take it in between.
        attempt = 0
        while True:
            attempt += 1
            self.upstream_port = free_port()
            self._write_config()
            self._daemon = DaemonProcess("docker-registry", [binary, "serve", str(self.config_path)], self.log_path)
            self._daemon.start()
            try:
                self._daemon.wait_ready(self._answers, timeout=self.start_timeout)
            except DaemonStartError:
                if attempt >= 3 or "address already in use" not in self._daemon.log_tail(5):
                    raise
                continue
            break
        if self.door is None:
            self.port = self.upstream_port
        else:
            self.front = RegistryFront(self.upstream_port, self.auth_upstream, self.door, realm=self.realm).start()
            self.port = self.front.port
        return self

    @property
    def auth_upstream(self) -> tuple[str, str]:
        """The front's own user of docker-registry."""
        return next(iter(self.htpasswd_users.items()))

    def stop(self) -> None:
        """Stop the registry (SIGTERM, then SIGKILL) and its front."""
        if self.front is not None:
            self.front.stop()
            self.front = None
        if self._daemon is not None:
            self._daemon.stop()

    def remove_data(self) -> None:
        """Delete every stored blob and manifest."""
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the registry's log, for failure messages."""
        return self._daemon.log_tail(lines) if self._daemon is not None else "(registry never started)"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""A private containerd (with its CRI plugin) for tests and local mode, isolated under one directory.

Nothing is shared with a containerd the host may run: root, state, sockets, temp files, CNI and
registry configuration all live under ``base_dir``. Registries are reached through
``certs.d/<host>/hosts.toml`` files, so any image host name (an ECR one included) can be served by a
local registry over plain http.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from prewarm_agent.cri.client import ContentStatusReader, CriImageClient, IngestStatus
from prewarm_agent.cri.errors import CriError
from prewarm_devtools.node.process import DaemonBacked, DaemonProcess, DaemonStartError

# Which containerd runs: PREWARM_CONTAINERD=2.1 (Debian sid's 2.1.9, the default: EKS's AL2023 nodes run
# 2.x), 1.7 (trixie's 1.7.24) or 1.6 (the host's bookworm package). 2.1 and 1.7 are the binaries of a
# Debian root filesystem that `make node-deps` builds once with mmdebstrap (devtools/node-deps.sh) and
# keeps under CONTAINERD_CACHE/<version>/bin; they need only libc, and use the host's runc.
CONTAINERD_VERSION_ENV = "PREWARM_CONTAINERD"
DEFAULT_CONTAINERD = "2.1"
CONTAINERD_VERSIONS = ("2.1", "1.7", "1.6")
CONTAINERD_CACHE = Path(os.environ.get("PREWARM_CONTAINERD_CACHE", "/var/cache/prewarm/containerd"))
# Unix socket paths longer than this fail to bind (sun_path is 108 bytes, containerd adds ".ttrpc").
_MAX_SOCKET_PATH = 100
# Snapshotters that cannot work in a private test instance; disabling them keeps start-up quiet.
DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
)
SANDBOX_IMAGE = "registry.k8s.io/pause:3.6"


class ContainerdVersionError(ValueError):
    """PREWARM_CONTAINERD names no version we run, or that version's binaries are not installed."""


def selected_version() -> str:
    """The containerd version asked for (PREWARM_CONTAINERD, default 2.1)."""
    version = os.environ.get(CONTAINERD_VERSION_ENV, "").strip() or DEFAULT_CONTAINERD
    if version not in CONTAINERD_VERSIONS:
        raise ContainerdVersionError(
            f"{CONTAINERD_VERSION_ENV}={version!r} is not one of {', '.join(CONTAINERD_VERSIONS)}"
        )
    return version


def containerd_bin_dir(version: str) -> Path | None:
    """The directory holding containerd, its shim and ctr for ``version``; None if not installed."""
    if version == "1.6":
        found = shutil.which("containerd")
        return Path(found).parent if found else None
    directory = CONTAINERD_CACHE / version / "bin"
    return directory if (directory / "containerd").is_file() else None


def containerd_missing(version: str | None = None) -> str | None:
    """Why the selected containerd cannot run here (what to run to get it), or None when it can."""
    version = version or selected_version()
    if containerd_bin_dir(version) is not None:
        return None
    if version == "1.6":
        return "containerd is not installed: run `make node-deps PREWARM_CONTAINERD=1.6` as root"
    return (f"containerd {version} is not under {CONTAINERD_CACHE}: run "
            f"`make node-deps PREWARM_CONTAINERD={version}` as root")


@dataclass(frozen=True)
class PullSettings:
    """The CRI's pull settings; None leaves containerd's default. Each is refused on a version without it.

    ``max_concurrent_downloads``: layers fetched at once per pull (default 3). ``progress_timeout``:
    ``image_pull_progress_timeout``, a pull with no byte progress for that long is cancelled (1.7 and
    later, default 5m; "0s" turns it off, but hangs 2.x pulls through the transfer service:
    containerd#14158). ``local_pull``: ``use_local_image_pull``, 2.x pulls in the CRI plugin instead of
    through the transfer service. ``layer_fetch_buffer``: ``concurrent_layer_fetch_buffer``, bytes of
    each of several ranged requests one layer is fetched with (2.1 and later). ``unpigz_dir``: a
    directory holding ``unpigz``, put on containerd's PATH: it then decompresses layers with it.
    """

    max_concurrent_downloads: int | None = None
    progress_timeout: str | None = None
    local_pull: bool | None = None
    layer_fetch_buffer: int | None = None
    unpigz_dir: Path | None = None

    def refused_by(self, version: str) -> str | None:
        """Why containerd ``version`` has no such setting, or None."""
        if self.progress_timeout is not None and version == "1.6":
            return "progress_timeout: containerd 1.6 has no image_pull_progress_timeout (1.7 and later)"
        if self.local_pull is not None and not version.startswith("2."):
            return f"local_pull: containerd {version} has no transfer service to turn off (2.x)"
        if self.layer_fetch_buffer is not None and version not in ("2.1",):
            return f"layer_fetch_buffer: containerd {version} has no concurrent_layer_fetch_buffer (2.1 and later)"
        return None


def _toml(value: str) -> str:
    # A JSON string is a valid TOML basic string.
    return json.dumps(value)


_OVERLAY_WORKS: dict[int, bool] = {}  # by filesystem (st_dev): what the probe found there


def overlayfs_works(probe_parent: Path) -> bool:
    """True when an overlay mount succeeds on the filesystem of ``probe_parent`` (needs root).

    Overlay fails on some sandboxes and when the directory is itself on overlayfs (nested Docker),
    and containerd's CRI plugin then refuses to load, so the snapshotter is chosen by trying, once per
    filesystem: unmounting an overlay syncs its upper filesystem, which costs a node's start seconds
    when a large copy (a restored snapshot) was just written there.
    """
    if shutil.which("mount") is None or os.geteuid() != 0:
        return False
    probe_parent.mkdir(parents=True, exist_ok=True)
    device = probe_parent.stat().st_dev
    if device not in _OVERLAY_WORKS:
        _OVERLAY_WORKS[device] = _overlay_mounts(probe_parent)
    return _OVERLAY_WORKS[device]


def _overlay_mounts(probe_parent: Path) -> bool:
    with tempfile.TemporaryDirectory(prefix="overlay-probe-", dir=probe_parent) as probe:
        lower, upper, work, merged = (Path(probe, name) for name in ("lower", "upper", "work", "merged"))
        for path in (lower, upper, work, merged):
            path.mkdir()
        mounted = subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={lower},upperdir={upper},workdir={work}",
                str(merged),
            ],
            capture_output=True,
            check=False,
        )
        if mounted.returncode != 0:
            return False
        subprocess.run(["umount", str(merged)], capture_output=True, check=True)
        return True


def _mounts_under(base_dir: Path) -> list[str]:
    base = str(base_dir.resolve())
    mounts = []
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        for line in mountinfo:
            # Field 5 is the mount point, with spaces and the like escaped as octal.
            point = line.split()[4].encode().decode("unicode_escape")
            if point == base or point.startswith(base + "/"):
                mounts.append(point)
    return mounts


def unmount_all_under(base_dir: Path) -> int:
    """Unmount whatever a killed containerd left mounted under ``base_dir``, deepest first (lazily when a
    mount is busy); returns how many there were."""
    points = sorted(_mounts_under(base_dir), key=len, reverse=True)
    for point in points:
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return len(points)


class PrivateContainerd(DaemonBacked):
    """containerd with its CRI plugin, running from ``base_dir``; use as a context manager.

    ``snapshotter`` defaults to overlayfs when an overlay mount works here, else native.
    ``stop``/``kill`` and ``start`` keep the content store, so images survive a restart.
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        snapshotter: str | None = None,
        start_timeout: float = 20.0,
        log_level: str = "info",
        version: str | None = None,
        pull: PullSettings | None = None,
    ) -> None:
        self.version = version or selected_version()
        self.pull = pull or PullSettings()
        if (refused := self.pull.refused_by(self.version)) is not None:
            raise ContainerdVersionError(refused)
        bin_dir = containerd_bin_dir(self.version)
        if bin_dir is None:
            raise ContainerdVersionError(containerd_missing(self.version))
        self.bin_dir = bin_dir
        self.base_dir = Path(base_dir).resolve()
        self.socket_path = self.base_dir / "containerd.sock"
        if len(str(self.socket_path)) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"base_dir {self.base_dir} is too long for a unix socket path "
                f"(max {_MAX_SOCKET_PATH} characters with /containerd.sock); use a shorter directory"
            )
        self.config_path = self.base_dir / "config.toml"
        self.certs_dir = self.base_dir / "certs.d"
        self.root_dir = self.base_dir / "root"
        self.state_dir = self.base_dir / "state"
        self.log_path = self.base_dir / "containerd.log"
        self.start_timeout = start_timeout
        self.log_level = log_level
        self.snapshotter = snapshotter or ("overlayfs" if overlayfs_works(self.base_dir) else "native")
        # The shim is looked up on PATH: this version's own first, then the host's runc.
        path = [str(bin_dir), *([str(self.pull.unpigz_dir)] if self.pull.unpigz_dir else []),
                os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")]
        env = {**os.environ, "PATH": ":".join(path)}
        self._daemon = DaemonProcess(
            "containerd", [str(bin_dir / "containerd"), "--config", str(self.config_path)], self.log_path, env
        )

    @property
    def ctr(self) -> str:
        """The path of this version's ``ctr``."""
        return str(self.bin_dir / "ctr")

    def config_text(self) -> str:
        """The containerd config (version 2) this instance runs with."""
        base = self.base_dir
        disabled = ", ".join(_toml(name) for name in DISABLED_PLUGINS)
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = {_toml(str(self.root_dir))}
state = {_toml(str(self.state_dir))}
temp = {_toml(str(base / "tmp"))}
disabled_plugins = [{disabled}]

[grpc]
  address = {_toml(str(self.socket_path))}

[ttrpc]
  address = {_toml(str(self.socket_path) + ".ttrpc")}

[debug]
  level = {_toml(self.log_level)}

[plugins."io.containerd.internal.v1.opt"]
  path = {_toml(str(base / "opt"))}

{cri}]
  sandbox_image = {_toml(SANDBOX_IMAGE)}
  disable_cgroup = true
  disable_apparmor = true
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # ImageFsInfo answers from a cache refreshed this often (seconds); the default is 10.
  stats_collect_period = 1
{self._pull_lines()}
{cri}.containerd]
  snapshotter = {_toml(self.snapshotter)}

{cri}.cni]
  bin_dir = {_toml(str(base / "cni" / "bin"))}
  conf_dir = {_toml(str(base / "cni" / "net.d"))}

{cri}.registry]
  config_path = {_toml(str(self.certs_dir))}
{self._nri_section()}{self._transfer_section()}"""

    def _nri_section(self) -> str:
        # 2.x runs NRI by default on /var/run/nri/nri.sock: one socket of each node's own, or two nodes
        # starting together race for the host's ("bind: address already in use"). 1.6 has no NRI plugin.
        if not self.version.startswith("2."):
            return ""
        return f"""
[plugins."io.containerd.nri.v1.nri"]
  socket_path = {_toml(str(self.base_dir / "nri.sock"))}
"""

    def _pull_lines(self) -> str:
        settings = self.pull
        lines = []
        # On 2.x a CRI max_concurrent_downloads turns the transfer service off ("incompatible with transfer
        # service ... Falling back to local image pull mode"): it goes to the transfer plugin's section.
        if settings.max_concurrent_downloads is not None and not self._through_transfer:
            lines.append(f"  max_concurrent_downloads = {settings.max_concurrent_downloads}")
        if settings.progress_timeout is not None:
            lines.append(f"  image_pull_progress_timeout = {_toml(settings.progress_timeout)}")
        return "\n".join(lines) + "\n" if lines else ""

    @property
    def _through_transfer(self) -> bool:
        return self.version.startswith("2.") and not self.pull.local_pull

    def _transfer_section(self) -> str:
        # Settings new in 2.x, which its migration of a version 2 config does not carry over from the CRI
        # plugin's section: they go to the images plugin's own, which the migration merges into.
        settings = self.pull
        images: list[str] = []
        transfer: list[str] = []
        if settings.local_pull is not None:
            images.append(f"  use_local_image_pull = {'true' if settings.local_pull else 'false'}")
        if settings.layer_fetch_buffer is not None:
            (transfer if self._through_transfer else images).append(
                f"  concurrent_layer_fetch_buffer = {settings.layer_fetch_buffer}")
        if settings.max_concurrent_downloads is not None and self._through_transfer:
            transfer.append(f"  max_concurrent_downloads = {settings.max_concurrent_downloads}")
        sections = []
        if images:
            sections += ['\n[plugins."io.containerd.cri.v1.images"]', *images]
        if transfer:
            sections += ['\n[plugins."io.containerd.transfer.v1.local"]', *transfer]
        return "\n".join(sections) + "\n" if sections else ""

    def add_registry_mirror(self, host: str, endpoint: str) -> Path:
        """Serve image host ``host`` (``127.0.0.1:5000``, ``1234.dkr.ecr.us-west-2.amazonaws.com``) from
        ``endpoint`` (``http://127.0.0.1:<port>``), over plain http or unverified TLS.

        containerd reads ``hosts.toml`` on every pull, so this works while it runs.
        """
        host_dir = self.certs_dir / host
        host_dir.mkdir(parents=True, exist_ok=True)
        path = host_dir / "hosts.toml"
        # containerd 1.6 rejects a hosts.toml without a host table ("invalid `host` tree"); an empty
        # one keeps the server as the only endpoint, so a failed pull is not retried elsewhere.
        # skip_verify only for https: containerd 2.x tries HTTPS first on an http server that has a TLS
        # setting ("host will try HTTPS first since it is configured for HTTP with a TLS configuration"),
        # and its fallback to http fails behind the local ECR front.
        tls = "skip_verify = true\n" if endpoint.startswith("https://") else ""
        path.write_text(
            f'server = {_toml(endpoint)}\ncapabilities = ["pull", "resolve"]\n{tls}\n[host]\n',
            encoding="utf-8",
        )
        return path

    def start(self) -> Self:
        """Write the config, start containerd and wait until the CRI answers ``Version``."""
        for path in (self.certs_dir, self.base_dir / "tmp", self.base_dir / "cni" / "net.d"):
            path.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text(), encoding="utf-8")
        # A previous instance killed with SIGKILL leaves its sockets behind.
        for stale in (self.socket_path, Path(str(self.socket_path) + ".ttrpc")):
            stale.unlink(missing_ok=True)
        self._daemon.start()
        self._daemon.wait_ready(self._answers, timeout=self.start_timeout)
        return self

    def _answers(self) -> bool:
        if not self.socket_path.exists():
            return False
        with CriImageClient(str(self.socket_path), timeout=1.0) as client:
            try:
                client.version()
            except CriError:
                return False
        return True

    def stop(self, grace: float = 5.0) -> None:
        """Stop containerd (SIGTERM, then SIGKILL after ``grace`` seconds)."""
        self._daemon.stop(grace)
        unmount_all_under(self.base_dir)

    def kill(self) -> None:
        """Kill containerd with SIGKILL, as a crash would."""
        self._daemon.kill()
        unmount_all_under(self.base_dir)

    def restart(self) -> Self:
        """Stop and start again with the same root: pulled images and partial downloads remain."""
        self.stop()
        return self.start()

    def cri_client(self, timeout: float = 10.0) -> CriImageClient:
        """A CRI client on this containerd's socket; close it when done."""
        return CriImageClient(str(self.socket_path), timeout=timeout)

    def content_status_reader(self) -> ContentStatusReader:
        """A reader of this containerd's in-flight downloads (namespace ``k8s.io``); close it when done."""
        return ContentStatusReader(str(self.socket_path))

    def stats_ingest(self) -> list[IngestStatus]:
        """The in-flight downloads right now."""
        with self.content_status_reader() as reader:
            statuses: list[IngestStatus] = reader.list_statuses()
        return statuses

    def log_tail(self, lines: int = 40) -> str:
        """The end of containerd's log, for failure messages."""
        return self._daemon.log_tail(lines)

    def remove_data(self) -> None:
        """Delete the content store, snapshots and state (containerd must be stopped); keeps the log."""
        if self.running:
            raise DaemonStartError(f"containerd (PID {self.pid}) is running; stop it before removing its data")
        unmount_all_under(self.base_dir)
        for path in (self.root_dir, self.state_dir, self.base_dir / "tmp", self.base_dir / "opt"):
            shutil.rmtree(path, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The servers a benchmark talks to, each in its own process so its CPU and memory are not measured.

`KubeApiProcess` runs the embedded Kubernetes API (`python -m prewarm_devtools.kubeapi`);
`MotoProcess` runs moto's `ThreadedMotoServer` (`python -m benchmarks.servers moto`). Both listen
on 127.0.0.1 only and are stopped (SIGTERM, then SIGKILL) when their `with` block ends.
"""

from __future__ import annotations

import argparse
import os
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import yaml

from benchmarks.measure import ROOT, BenchmarkError

_START_TIMEOUT = 180.0


class ServerProcess:
    """A child process that prints `<marker><url>` once it serves; `url` is that URL."""

    def __init__(self, command: Sequence[str], marker: str, what: str) -> None:
        self.command = list(command)
        self.marker = marker
        self.what = what
        self.url = ""
        self._process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._output: list[str] = []

    def start(self) -> Self:
        self._process = subprocess.Popen(
            self.command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._drain, name=f"{self.what} output", daemon=True).start()
        while True:
            try:
                line = self._lines.get(timeout=_START_TIMEOUT)
            except queue.Empty:
                self.stop()
                raise BenchmarkError(f"{self.what} did not start within {_START_TIMEOUT:.0f} s") from None
            if line is None:
                self.stop()
                raise BenchmarkError(f"{self.what} exited before serving:\n{''.join(self._output[-40:])}")
            if line.startswith(self.marker):
                self.url = line[len(self.marker) :].strip()
                return self

    def _drain(self) -> None:
        # Keeps reading so a chatty server never blocks on a full pipe.
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            self._output.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def cpu_seconds(self) -> float:
        """User plus system CPU time the server has used so far, all its threads included."""
        if self._process is None:
            return 0.0
        with open(f"/proc/{self._process.pid}/stat") as stat:
            # Fields after the parenthesised command name; utime and stime are the 14th and 15th.
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=15)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class KubeApiProcess(ServerProcess):
    """The embedded Kubernetes API with `nodes` synthetic EKS nodes and the objects of `seeds`; with `tls`,
    over HTTPS with a CA of its own (`ca_data`, base64 PEM as EKS's `certificateAuthority.data`). It takes EKS
tokens signed for `cluster_name` only, as EKS does."""

    def __init__(self, nodes: int = 0, seeds: Sequence[Path] = (), token: str | None = None, tls: bool = False,
                 cluster_name: str = "local") -> None:
        self.token = token or f"bench-{secrets.token_urlsafe(16)}"
        self.ca_data = ""
        self._kubeconfig: Path | None = None
        command = [sys.executable, "-m", "prewarm_devtools.kubeapi", "--port", "0", "--token", self.token,
                   "--cluster-name", cluster_name]
        if nodes:
            command += ["--nodes", str(nodes)]
        for seed in seeds:
            command += ["--seed", str(seed)]
        if tls:
            fd, name = tempfile.mkstemp(prefix="bench-kubeconfig-")
            os.close(fd)
            self._kubeconfig = Path(name)
            command += ["--tls", "--kubeconfig", name]
        super().__init__(command, "Kubernetes API: ", "the embedded Kubernetes API")

    def start(self) -> Self:
        super().start()
        try:
            self._read_ca()
        except BaseException:  # a server that cannot be used is not left running (no `with` block ends it)
            self.stop()
            raise
        return self

    def _read_ca(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while self._kubeconfig is not None and not self.ca_data:
            # The server writes its kubeconfig just after it says it serves.
            config = yaml.safe_load(self._kubeconfig.read_text() or "null")
            if config:
                self.ca_data = config["clusters"][0]["cluster"]["certificate-authority-data"]
            elif time.monotonic() > deadline:
                raise BenchmarkError(f"{self.what} wrote no kubeconfig within {_START_TIMEOUT:.0f} s")
            else:
                time.sleep(0.05)

    def stop(self) -> None:
        super().stop()
        if self._kubeconfig is not None:
            self._kubeconfig.unlink(missing_ok=True)


class MotoProcess(ServerProcess):
    """moto's ThreadedMotoServer in a child process."""

    def __init__(self) -> None:
        super().__init__([sys.executable, "-m", "benchmarks.servers", "moto"], "moto: ", "the moto server")


def _serve_moto() -> int:
    from prewarm_devtools.sam.aws import MotoServer

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with MotoServer() as server:
        print(f"moto: {server.url}", flush=True)
        while not stop.wait(0.5):
            pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.servers", description=__doc__)
    parser.add_argument("server", choices=["moto"], help="which server to run until SIGTERM")
    parser.parse_args(argv)
    return _serve_moto()


if __name__ == "__main__":
    sys.exit(main())

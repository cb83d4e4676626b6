"""Real etcd members for the tests: Debian's ``etcd`` (``scripts/setup.sh`` installs ``etcd-server``),
each in a temp dir on loopback ports, one member or a cluster of three, stopped, killed and
started again by name."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from safepoint.devtools.broker import free_port

from observers import missing_tool

ETCD = shutil.which("etcd")


@pytest.fixture(autouse=True)
def _needs_etcd() -> None:
    """Every test of a module that imports this fixture needs Debian's etcd."""
    if ETCD is None:
        missing_tool("Debian's etcd-server is not installed (scripts/setup.sh installs it as root)")


class Member:
    def __init__(self, name: str, base: Path, cluster: str, token: str, extra: list[str]) -> None:
        self.name, self.base, self.extra = name, base, extra
        self.client_port, self.peer_port = free_port(), free_port()
        self.client_url = f"http://127.0.0.1:{self.client_port}"
        self.peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.cluster, self.token = cluster, token
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_once = False

    def argv(self) -> list[str]:
        assert ETCD is not None
        return [ETCD, "--name", self.name, "--data-dir", str(self.base / self.name),
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", self.cluster, "--initial-cluster-token", self.token,
                "--initial-cluster-state", "new", "--heartbeat-interval", "50", "--election-timeout", "500",
                *self.extra]

    def start(self) -> None:
        log = (self.base / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        self.started_once = True

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def healthy(self) -> bool:
        try:
            return httpx.get(self.client_url + "/health", timeout=1).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False


class EtcdCluster:
    """``size`` members started together (``--auto-compaction-*`` and other flags in ``extra``)."""

    def __init__(self, base: Path, size: int = 1, extra: list[str] | None = None) -> None:
        base.mkdir(parents=True, exist_ok=True)
        names = [f"m{i}" for i in range(size)]
        self.members: list[Member] = []
        for name in names:
            self.members.append(Member(name, base, "", f"sp-{base.name}", list(extra or [])))
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.cluster = initial

    @property
    def endpoints(self) -> str:
        return ",".join(m.client_url for m in self.members)

    def start(self, timeout_s: float = 30.0) -> EtcdCluster:
        for m in self.members:
            m.start()
        self.wait_healthy(timeout_s)
        return self

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(m.healthy() for m in self.members if m.proc is not None and m.proc.poll() is None):
                return
            time.sleep(0.1)
        logs = {m.name: (m.base / f"{m.name}.log").read_text(errors="replace")[-2000:] for m in self.members}
        raise AssertionError(f"etcd did not become healthy in {timeout_s} s: {logs}")

    def leader(self) -> Member:
        for m in self.members:
            if m.proc is None or m.proc.poll() is not None:
                continue
            try:
                got = httpx.post(m.client_url + "/v3/maintenance/status", content="{}", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                continue
            if got.get("leader") and got.get("leader") == got.get("header", {}).get("member_id"):
                return m
        raise AssertionError("no leader")

    def stop(self) -> None:
        for m in self.members:
            m.stop()

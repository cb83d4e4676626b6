"""Local etcd members, as the tests, the etcd example and the bench start them: Debian's ``etcd``
(``scripts/setup.sh`` installs ``etcd-server``), each member in a directory of its own on loopback
ports, one member or a cluster of several, stopped, killed and started again by name."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx

from safepoint.devtools.broker import free_port
from safepoint.errors import SafepointError

__all__ = ["ETCD", "LocalEtcd", "Member", "etcd_missing"]

ETCD = shutil.which("etcd")


def etcd_missing() -> str | None:
    """None when Debian's etcd is installed, else what to do."""
    return None if ETCD else "Debian's etcd-server is not installed (scripts/setup.sh installs it as root)"


class Member:
    def __init__(self, name: str, base: Path, token: str, extra: list[str]) -> None:
        self.name, self.base, self.token, self.extra = name, base, token, extra
        self.client_url = f"http://127.0.0.1:{free_port()}"
        self.peer_url = f"http://127.0.0.1:{free_port()}"
        self.cluster = ""
        """``--initial-cluster``: every member's name=peer URL (set by ``LocalEtcd``)."""
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        if ETCD is None:
            raise SafepointError(str(etcd_missing()))
        return [ETCD, "--name", self.name, "--data-dir", str(self.base / self.name),
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", self.cluster, "--initial-cluster-token", self.token,
                "--initial-cluster-state", "new", "--heartbeat-interval", "50", "--election-timeout", "500",
                *self.extra]

    def start(self) -> None:
        with (self.base / f"{self.name}.log").open("ab") as log:
            # a session of its own: a Ctrl-C to the command that runs it (the demo, the example) lets that
            # command stop it after what talks to it
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def healthy(self) -> bool:
        try:
            return bool(httpx.get(self.client_url + "/health", timeout=1).json().get("health") == "true")
        except (httpx.HTTPError, ValueError):
            return False


class LocalEtcd:
    """``size`` members started together in ``base`` (``--auto-compaction-*`` and other flags in ``extra``)."""

    def __init__(self, base: Path, size: int = 1, extra: list[str] | None = None) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.members = [Member(f"m{i}", base, f"sp-{base.name}", list(extra or [])) for i in range(size)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.cluster = initial

    @property
    def endpoints(self) -> str:
        """The members' client URLs, comma-separated."""
        return ",".join(m.client_url for m in self.members)

    def start(self, timeout_s: float = 30.0) -> LocalEtcd:
        for m in self.members:
            m.start()
        try:
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until every running member says it is healthy; ``SafepointError`` with their logs' ends after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(m.healthy() for m in self.members if m.alive()):
                return
            time.sleep(0.1)
        logs = {m.name: (m.base / f"{m.name}.log").read_text(errors="replace")[-2000:] for m in self.members}
        msg = f"etcd did not become healthy in {timeout_s:.0f} s: {logs}"
        raise SafepointError(msg)

    def leader(self) -> Member:
        for m in self.members:
            if not m.alive():
                continue
            try:
                got = httpx.post(m.client_url + "/v3/maintenance/status", content="{}", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                continue
            if got.get("leader") and got.get("leader") == got.get("header", {}).get("member_id"):
                return m
        msg = "no etcd member is the leader"
        raise SafepointError(msg)

    def stop(self) -> None:
        for m in self.members:
            m.stop()

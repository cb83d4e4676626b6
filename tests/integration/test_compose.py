"""``docker compose up`` runs the product: the deployment page's lines, run as written (in a compose
project of the test's own, on ports of its own), bring up three brokers, Spark, the job, serve,
Prometheus, PostgreSQL and its agent and the simulator, from a clean state. The test reads a
directive, the dashboard, the metrics and an alert that fires through Prometheus's own API (a node
reporting pinned bytes past the critical band: ``SafepointPressureCritical``); then the faults a
deployment on containers meets: the job's processes killed (its restart policy starts the container
again on its checkpoint volume) and a Spark worker's container killed, while three nodes on the host
open and close readers. No directive passes a reader open on its node, every listener sees seq and
safe_ts only move forward, directives resume after each fault, and the job has every event the nodes
sent (each node's seq in the status, no hold left open). ``down -v`` leaves no container, volume or
network of the project behind.

The compose file's checks that need no engine (it validates; it pins the Kafka, the connector and the
rules the tests run) run anywhere."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import Reporter
from safepoint.devtools.broker import free_port

from doc_blocks import block
from fault_nodes import ReaderNode, check_nodes, close_all, mvcc, stop_all
from kafka_util import unique
from observers import missing_tool
from tests_support import report, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
SERVICES = ("kafka1", "kafka2", "kafka3", "spark-master", "spark-worker-1", "spark-worker-2", "job", "serve", "prometheus",
            "postgres", "agent-postgres", "simulator", "view")
LINES = "./scripts/images.sh"
"""The first line of the deployment page's block."""


def pinned(pom: str, prop: str) -> str:
    """A version the Maven file ``pom`` (of scripts/jars/) pins as the property ``prop``."""
    found = re.search(rf"<{re.escape(prop)}>([^<]+)</", (ROOT / "scripts" / "jars" / pom / "pom.xml").read_text())
    assert found, (pom, prop)
    return found.group(1)


def compose_cli() -> list[str] | None:
    legacy = shutil.which("docker-compose")
    if legacy:
        return [legacy]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0:
        return [docker, "compose"]
    return None


def test_compose_file_validates() -> None:
    cli = compose_cli()
    if cli is None:
        missing_tool("no docker-compose (or `docker compose` plugin) on PATH (scripts/setup.sh installs Debian's as root)")
    proc = subprocess.run([*cli, "-f", str(COMPOSE), "config"], capture_output=True, text=True, check=False,
                          cwd=COMPOSE.parent, env={k: v for k, v in os.environ.items() if not k.endswith("_IMAGE")})
    assert proc.returncode == 0, proc.stderr
    for service in SERVICES:
        assert f"  {service}:" in proc.stdout, service


def test_compose_pins_the_versions_the_tests_run() -> None:
    """The compose file's Kafka is the one setup installs for the tests (the official image by default,
    the image made from the same jars otherwise), its Spark the pinned PySpark's with the connector for
    it inside the image, its Prometheus loads the rules promtool checks (tests/unit/test_alert_rules.py)."""
    import pyspark

    text = COMPOSE.read_text()
    kafka = pinned("kafka", "kafka.version")
    assert f"${{KAFKA_IMAGE:-apache/kafka:{kafka}}}" in text and ":latest" not in text
    assert pinned("spark-kafka", "spark.version") == pyspark.__version__
    assert re.search(rf'"pyspark=={re.escape(pyspark.__version__)}"', (ROOT / "pyproject.toml").read_text())
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml" in text
    assert "/etc/prometheus/alerts.yml" in (ROOT / "docker" / "prometheus" / "prometheus.yml").read_text()
    for port in re.findall(r'ports: \["([^"]+)"\]', text):
        assert port.startswith("127.0.0.1:"), f"{port}: every published port is bound to loopback"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - the compose project's ports, on loopback
        return json.loads(resp.read())


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - the compose project's ports, on loopback
        return str(resp.read().decode())


def quietly(call: Any) -> Any:
    try:
        return call()
    except Exception:  # noqa: BLE001 - not up yet: asked again
        return None


class Project:
    """The compose project the test's lines run in: its name, ports and environment."""

    def __init__(self) -> None:
        self.name = unique("sptest").replace("-", "")
        self.ports = {k: free_port() for k in ("KAFKA1_PORT", "KAFKA2_PORT", "KAFKA3_PORT", "SAFEPOINT_DASHBOARD_PORT",
                                               "PROMETHEUS_PORT", "SPARK_UI_PORT")}
        # the brokers' JVMs as the suite's others (quick compiler, one collector thread: they live minutes),
        # and a quarter of the simulator's default rate; the rest is the compose file's
        self.env = {**os.environ, "COMPOSE_PROJECT_NAME": self.name, **{k: str(v) for k, v in self.ports.items()},
                    "KAFKA_JVM_PERFORMANCE_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true",
                    "KAFKA_HEAP_OPTS": "-Xmx384m -Xms64m", "SIMULATOR_RATE": "50"}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[f'KAFKA{n}_PORT']}" for n in (1, 2, 3))

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.ports['SAFEPOINT_DASHBOARD_PORT']}"

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{self.ports['PROMETHEUS_PORT']}"

    def run(self, line: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    def compose(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker-compose", "-f", str(COMPOSE), *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=300, check=False)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def logs(self, service: str, lines: int = 40) -> str:
        return self.compose("logs", "--tail", str(lines), service).stdout

    def leftovers(self) -> list[str]:
        """The project's containers, volumes and networks that still exist."""
        label = f"label=com.docker.compose.project={self.name}"
        out = []
        for kind in (["ps", "-a"], ["volume", "ls"], ["network", "ls"]):
            listed = subprocess.run(["docker", *kind, "-q", "--filter", label], capture_output=True, text=True, check=False)
            out += [f"{kind[0]} {x}" for x in listed.stdout.split()]
        return out


def live_view(line: str, env: dict[str, str], timeout_s: float = 60) -> str:
    """What ``line`` (the page's ``run --rm view``) printed until it showed a safe point, then Ctrl-C."""
    import select
    import signal

    proc = subprocess.Popen(["bash", "-c", line], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout is not None
    out = b""
    deadline = time.monotonic() + timeout_s
    try:
        while b"safe" not in out and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                out += os.read(proc.stdout.fileno(), 65536)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return out.decode(errors="replace")


def alert_firing(prometheus: str, name: str, cluster: str) -> bool:
    alerts = get_json(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
    return any(a["labels"].get("alertname") == name and a["labels"].get("cluster") == cluster and a["state"] == "firing"
               for a in alerts)


def test_the_deployment_pages_compose_lines_run_the_product() -> None:
    from safepoint.devtools.containers import engine_missing

    lines = [ln.split("#", 1)[0].strip() for ln in block("docs/deploying.md", "./scripts/images.sh").text.splitlines()]
    lines = [ln for ln in lines if ln]
    readme = [ln.split("#", 1)[0].strip() for ln in block("README.md", "./scripts/images.sh").text.splitlines()]
    assert readme == lines[:2], "the README's lines are the page's first two, which this test runs"
    verbs = [shlex.split(ln)[3] if ln.startswith("docker-compose") else ln for ln in lines]
    assert verbs == [LINES, "up", "ps", "run", "down"], verbs
    for line in lines[1:]:
        words = shlex.split(line)
        assert words[:3] == ["docker-compose", "-f", "docker/compose.yaml"] and (ROOT / words[2]) == COMPOSE, line
        unknown = {w for w in words[4:] if not w.startswith("-")} - set(SERVICES)
        assert not unknown, f"{line}: no service {sorted(unknown)}"
    why = engine_missing()
    if why:
        missing_tool(why)
    if compose_cli() is None:
        missing_tool("no docker-compose on PATH (scripts/setup.sh installs Debian's as root)")
    project = Project()
    figures: dict[str, float] = {}
    nodes: list[ReaderNode] = []
    pressure: Reporter | None = None
    listener: DirectiveListener | None = None
    seen: list[tuple[float, int]] = []
    try:
        project.run(lines[0])  # the images: cached (scripts/test.sh built them before the tests)
        up = time.monotonic()
        project.run(lines[1])
        figures["up_s"] = time.monotonic() - up

        # a directive of a simulated cluster, read as a node reads it (through the brokers' host listener)
        listener = DirectiveListener(project.bootstrap, "default1", on_directive=lambda d: seen.append((time.monotonic(), d.seq)))
        listener.start()
        wait_for(lambda: bool(seen), 600, "the first directive of cluster default1", every_s=0.5)
        figures["up_to_directive_s"] = seen[0][0] - up
        wait_for(lambda: {"default1", "default2", "pg"} <= {c["cluster"] for c in
                                                             (quietly(lambda: get_json(f"{project.dashboard}/api/v1/clusters")) or
                                                              {"clusters": []})["clusters"]},
                 300, "the dashboard's API to show the simulated clusters and PostgreSQL's")
        page = get_text(f"{project.dashboard}/")
        assert "safepoint: what pins history" in page
        figures["up_to_dashboard_s"] = time.monotonic() - up
        metrics = get_text(f"{project.dashboard}/metrics")
        assert 'safepoint_safe_ts{cluster="default1"}' in metrics and "safepoint_job_report_time_seconds" in metrics
        pg = get_json(f"{project.dashboard}/api/v1/clusters/pg")
        assert pg["mvcc_unit"] == "xid" and any(n["node"] == "pg-primary" for n in pg["nodes"]), pg

        # nodes on the host, and one whose pinned bytes are past the critical band: Prometheus fires
        nodes = [ReaderNode(project.bootstrap, name, "safepoint.events", "safepoint.directives", cluster="host")
                 for name in ("h1", "h2", "h3")]
        for n in nodes:
            n.thread.start()
        wait_for(lambda: all(len(n.seen) >= 3 for n in nodes), 300, "three directives at every host node")
        pressed = time.monotonic()
        pressure = Reporter(project.bootstrap, "h-pinned", mvcc_clock=mvcc, cluster="host", incarnation=1,
                            figures=lambda: {"pinned_bytes": 3_000_000_000})
        wait_for(lambda: bool(quietly(lambda: alert_firing(project.prometheus, "SafepointPressureCritical", "host"))),
                 180, "Prometheus to fire SafepointPressureCritical for cluster host", every_s=1.0)
        figures["pressure_to_alert_s"] = time.monotonic() - pressed
        assert project.run(lines[2]).stdout.count("(healthy)") >= 10

        # the job's processes killed: its restart policy starts the container again, on its checkpoint
        job = project.container("job")
        killed = time.monotonic()
        subprocess.run(["docker", "exec", job, "pkill", "-9", "-f", "SparkSubmit"], check=False)
        wait_for(lambda: all(n.directives_since(killed + 1) >= 3 for n in nodes), 300,
                 "three directives at every host node after the job was killed", every_s=0.5)
        figures["job_kill_to_directive_s"] = max(min(t for t, _ in n.seen if t > killed + 1) for n in nodes) - killed
        restarts = json.loads(subprocess.run(["docker", "inspect", job], capture_output=True, text=True, check=True).stdout)
        assert restarts[0]["RestartCount"] >= 1, "the restart policy started the job again"

        # a worker's container killed: its executor is lost, the other worker's takes the tasks
        worker = project.container("spark-worker-1")
        killed = time.monotonic()
        subprocess.run(["docker", "kill", worker], check=True, capture_output=True)
        wait_for(lambda: all(n.directives_since(killed) >= 3 for n in nodes), 300,
                 "three directives at every host node after a worker was killed", every_s=0.5)
        figures["worker_kill_to_directive_s"] = max(min(t for t, _ in n.seen if t > killed) for n in nodes) - killed
        assert project.compose("start", "spark-worker-1").returncode == 0

        # the live view, as the page runs it, until Ctrl-C
        assert "safe" in live_view(lines[3], project.env), "the live view shows a safe point"

        # nothing lost: once the nodes are done, the job has every event they sent and no hold left
        stop_all(nodes)
        close_all(nodes)
        sent = {n.name: n.reporter.seq - 1 for n in nodes}  # the last seq each sent (seq is the next one)

        def applied() -> dict[str, int]:
            listed = get_json(f"{project.dashboard}/api/v1/clusters/host/nodes")["nodes"]
            return {n["node"]: n["seq"] for n in listed if n["node"] in sent}

        wait_for(lambda: quietly(applied) == sent, 120, f"the job to have every event of the host nodes ({sent})")
        wait_for(lambda: not (quietly(lambda: get_json(f"{project.dashboard}/api/v1/clusters/host"))
                              or {"hold_counts": {"reader": 1}})["hold_counts"].get("reader"),
                 120, "no reader of the host nodes left open in the job's state")
    except BaseException:
        for service in ("job", "serve", "spark-worker-1", "prometheus"):
            print(f"--- {service}\n{project.logs(service)}")
        raise
    finally:
        stop_all(nodes)
        close_all(nodes)
        if listener is not None:
            listener.close()
        if pressure is not None:
            pressure.close()
        down = time.monotonic()
        done = subprocess.run(["bash", "-c", lines[4]], cwd=ROOT, env=project.env, capture_output=True, text=True,
                              timeout=300, check=False)
        figures["down_s"] = time.monotonic() - down
    assert done.returncode == 0, done.stderr[-3000:]
    assert project.leftovers() == [], "down -v leaves nothing of the project behind"
    check_nodes(nodes)
    report("compose", **{k: round(v, 1) for k, v in figures.items()})

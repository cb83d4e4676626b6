"""The compose file validates and pins the Kafka and the Spark connector the tests run (Apache Kafka
itself runs in the suite from its jars, tests/integration/conftest.py); the deployment page's compose
lines name what exists, and run where a Docker engine does (skipped with the reason where it does
not). The compose file's check needs only a compose command, which setup installs: CI fails without it."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from doc_blocks import block
from observers import missing_tool

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"


def docker_engine() -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        proc = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker CLI or engine ({exc})"
    if proc.returncode != 0 or not proc.stdout.strip():
        return "no Docker engine answers (`docker info` failed): " + (proc.stderr.strip().splitlines() or ["?"])[-1]
    return None


def pinned(pom: str, prop: str) -> str:
    """A version the Maven file ``pom`` (of scripts/jars/) pins as the property ``prop``."""
    found = re.search(rf"<{re.escape(prop)}>([^<]+)</", (ROOT / "scripts" / "jars" / pom / "pom.xml").read_text())
    assert found, (pom, prop)
    return found.group(1)


def compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_file_validates() -> None:
    cli = compose_cli()
    if cli is None:
        missing_tool("no `docker compose` plugin or `docker-compose` on PATH (scripts/setup.sh installs Debian's as root)")
    proc = subprocess.run([*cli, "-f", str(COMPOSE), "config"], capture_output=True, text=True, check=False,
                          cwd=COMPOSE.parent)
    assert proc.returncode == 0, proc.stderr
    for service in ("kafka", "spark-master", "spark-worker", "job", "simulator", "view"):
        assert f"{service}:" in proc.stdout
    assert f"apache/kafka:{pinned('kafka', 'kafka.version')}" in proc.stdout
    assert f"spark-sql-kafka-0-10_2.13:{pinned('spark-kafka', 'spark.version')}" in proc.stdout


def test_compose_pins_the_versions_the_tests_run() -> None:
    """The compose file's Kafka is the one setup installs for the tests, and its Spark connector the one the
    tests put beside the pinned PySpark (Maven Central has no connector for PySpark 4.3.0: PySpark is
    pinned to 4.2.0, the newest version both have)."""
    import pyspark

    text = COMPOSE.read_text()
    assert pinned("spark-kafka", "spark.version") == pyspark.__version__
    assert re.search(rf'"pyspark=={re.escape(pyspark.__version__)}"', (ROOT / "pyproject.toml").read_text())
    assert f"spark-sql-kafka-0-10_2.13:{pyspark.__version__}" in text
    assert f"image: apache/kafka:{pinned('kafka', 'kafka.version')}" in text and ":latest" not in text


def test_the_readmes_compose_commands() -> None:
    """Each line of the deployment page's Docker block names the compose file and services that exist (checked
    here on any machine); with a Docker engine the lines run as written, each to exit 0."""
    lines = [ln.split("#", 1)[0].strip() for ln in block("docs/deploying.md", "docker compose -f docker/compose.yaml build").text.splitlines()]
    services = set(re.findall(r"^  ([a-z][a-z-]*):$", re.split(r"^services:$", COMPOSE.read_text(), flags=re.M)[1], re.M))
    verbs = []
    for line in filter(None, lines):
        words = shlex.split(line)
        assert words[:4] == ["docker", "compose", "-f", "docker/compose.yaml"], line
        assert (ROOT / words[3]) == COMPOSE
        verb, rest = words[4], [w for w in words[5:] if not w.startswith("-")]
        verbs.append(verb)
        unknown = set(rest) - services
        assert not unknown, f"{line}: no service {sorted(unknown)} in {COMPOSE.name} ({sorted(services)})"
    assert verbs == ["build", "up", "up", "run", "down"]
    why = docker_engine()
    if why:
        pytest.skip(f"the deployment page's compose lines are checked against the file but not run: {why}")
    for line in filter(None, lines):
        timeout = 1800 if " build" in line else 600
        if " run " in line:  # the live view runs until Ctrl-C: give it 30 s to show a safe point
            proc = subprocess.run(["timeout", "--signal=INT", "30", "bash", "-c", line], cwd=ROOT, capture_output=True,
                                  text=True, check=False)
            assert "safe" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
            continue
        proc = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"

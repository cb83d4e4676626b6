"""Issue 7: the compose file validates, and the integration suite runs against a real Apache
Kafka container where a Docker engine exists (skipped with the reason where it does not)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import docker_engine

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"


def compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_file_validates() -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` plugin or `docker-compose` on PATH (apt-get install docker-compose to check)")
    proc = subprocess.run([*cli, "-f", str(COMPOSE), "config"], capture_output=True, text=True, check=False,
                          cwd=COMPOSE.parent)
    assert proc.returncode == 0, proc.stderr
    for service in ("kafka", "spark-master", "spark-worker", "job", "simulator", "view"):
        assert f"{service}:" in proc.stdout
    assert "apache/kafka:4.1.0" in proc.stdout and "spark-sql-kafka-0-10_2.13:4.3.0" in proc.stdout


def test_compose_pins_versions_matching_pyspark() -> None:
    import pyspark

    text = COMPOSE.read_text()
    assert f"spark-sql-kafka-0-10_2.13:{pyspark.__version__}" in text
    assert "image: apache/kafka:4.1.0" in text and ":latest" not in text


@pytest.mark.integration
@pytest.mark.docker
def test_integration_suite_against_a_real_kafka_container() -> None:
    why = docker_engine()
    if why:
        pytest.skip(f"needs a Docker engine to start apache/kafka with testcontainers: {why}")
    env = {**os.environ, "SAFEPOINT_TEST_KAFKA": "container"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/integration/test_job_e2e.py", "tests/integration/test_parity.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

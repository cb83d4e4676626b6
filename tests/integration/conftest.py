"""One broker and one Spark session for the whole integration suite.

The broker is the embedded one unless SAFEPOINT_TEST_KAFKA says otherwise:
``container`` starts Apache Kafka (KRaft) with testcontainers (needs a Docker engine), and
``bootstrap=HOST:PORT`` uses a Kafka that is already running.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from safepoint.devtools.broker import EmbeddedBroker
from safepoint.streaming.java import C1_ONLY

KAFKA_IMAGE = "apache/kafka:4.1.0"

# Every Spark JVM the suite starts (its sessions, each job process, the README's commands: they
# inherit this) compiles with C1 only. The suite's JVMs live seconds to minutes, where C2's
# compiling is CPU spent for nothing: measured on 2 cores, a job's start to its first batch takes
# 26 CPU-s instead of 39-43 (the product keeps both compilers: its steady batch was 15% slower with
# C1 only). The Spark masters and workers of the cluster test take the same.
for _opts in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_opts, C1_ONLY)


@dataclass
class ExternalKafka:
    bootstrap: str


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


@pytest.fixture(scope="session")
def broker() -> Iterator[Any]:
    mode = os.environ.get("SAFEPOINT_TEST_KAFKA", "embedded")
    if mode.startswith("bootstrap="):
        yield ExternalKafka(mode.split("=", 1)[1])
        return
    if mode == "container":
        why = docker_engine()
        if why:
            pytest.skip(f"SAFEPOINT_TEST_KAFKA=container needs a Docker engine: {why}")
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer(KAFKA_IMAGE).with_kraft() as kafka:
            yield ExternalKafka(kafka.get_bootstrap_server())
        return
    b = EmbeddedBroker()
    b.start()
    try:
        yield b
    finally:
        b.cleanup()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # tests stay on loopback
    from safepoint.streaming.session import build_session

    # the whole offset log kept, as job_env keeps it for a job process: the verifier rebuilds every batch from it
    session = build_session(master="local[2]", shuffle_partitions=2, app="safepoint-tests",
                            extra={"spark.sql.streaming.minBatchesToRetain": "1000000"})
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def pg() -> Iterator[Any]:
    """A PostgreSQL server of its own (Debian's, as the ``postgres`` user, on loopback), removed after
    the test; the modules that use it import ``pg_util`` (which skips, or fails in CI, without one)."""
    from safepoint.devtools.postgres import LocalPostgres

    server = LocalPostgres().start()
    try:
        yield server
    finally:
        server.cleanup()

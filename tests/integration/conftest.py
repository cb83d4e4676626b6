"""One embedded broker, one Apache Kafka and one Spark session for the whole integration suite
(per pytest worker; each starts when a test first needs it).

``broker`` is the embedded broker for a module unless the module is marked ``kafka``
(``pytestmark = [..., pytest.mark.kafka]``): then it is Apache Kafka (KRaft) from the jars setup
installs (``apache_kafka``), as for the tests that check what only real Kafka does. The README's
table in docs/development.md says which modules run where. ``SAFEPOINT_TEST_KAFKA`` overrides it
for every module: ``kafka`` runs the whole suite on Apache Kafka, ``bootstrap=HOST:PORT`` on a
Kafka that is already running.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from safepoint.devtools.broker import EmbeddedBroker
from safepoint.jars import KAFKA, SPARK_KAFKA, installed
from safepoint.streaming.java import C1_ONLY

from observers import missing_tool

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


def require_jars(name: str) -> None:
    """Skip without the jars ``name`` for a developer; fail in CI (``missing_tool``)."""
    if not installed(name):
        missing_tool(f"the {name} jars are not installed (./scripts/setup.sh installs them from Maven Central)")


@pytest.fixture(scope="session")
def embedded_broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    b.start()
    try:
        yield b
    finally:
        b.cleanup()


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[Any]:
    """One Apache Kafka broker (its own controller) from the jars setup installs."""
    require_jars(KAFKA)
    from safepoint.devtools.apache_kafka import ApacheKafka

    kafka = ApacheKafka().start()
    try:
        yield kafka
    finally:
        kafka.cleanup()


@pytest.fixture(scope="module")
def broker(request: pytest.FixtureRequest) -> Any:
    mode = os.environ.get("SAFEPOINT_TEST_KAFKA", "")
    if mode.startswith("bootstrap="):
        return ExternalKafka(mode.split("=", 1)[1])
    if mode == "kafka" or request.node.get_closest_marker("kafka") is not None:
        return request.getfixturevalue("apache_kafka")
    if mode not in ("", "embedded"):
        pytest.fail(f"SAFEPOINT_TEST_KAFKA={mode!r}: use embedded, kafka or bootstrap=HOST:PORT")
    return request.getfixturevalue("embedded_broker")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # tests stay on loopback
    from safepoint.streaming.session import build_session, kafka_connector_conf

    # the whole offset log kept, as job_env keeps it for a job process: the verifier rebuilds every batch from it
    # Spark's own Kafka connector on the classpath where setup installed it (source_format = "kafka";
    # test_builtin_kafka.py fails in CI without it)
    connector = kafka_connector_conf() if installed(SPARK_KAFKA) else {}
    session = build_session(master="local[2]", shuffle_partitions=2, app="safepoint-tests",
                            extra={"spark.sql.streaming.minBatchesToRetain": "1000000", **connector})
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def mariadb() -> Iterator[Any]:
    """A MariaDB server of its own (Debian's, as the ``mysql`` user, on loopback), removed after the
    test; the modules that use it import ``mariadb_util`` (which skips, or fails in CI, without one)."""
    from safepoint.devtools.mariadb import LocalMariaDB

    server = LocalMariaDB().start()
    try:
        yield server
    finally:
        server.cleanup()


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

"""Where the Java parts that setup installs from Maven Central live: Apache Kafka's broker and Spark's
Kafka connector, each a folder of jars under ``.jars/`` of the checkout (``scripts/jars/*/pom.xml``
pins them; git ignores the folder).

``SAFEPOINT_JARS`` names another folder holding the same ``kafka/`` and ``spark-kafka/``; by default
it is the checkout's ``.jars``, found from this package's own place (an editable install, as setup
makes it).
"""

from __future__ import annotations

import os
from pathlib import Path

from safepoint.errors import ConfigError

__all__ = ["ENV", "KAFKA", "SPARK_KAFKA", "jars_root", "installed", "require"]

ENV = "SAFEPOINT_JARS"
KAFKA = "kafka"
"""Apache Kafka's broker (``kafka_2.13`` and what it depends on, with a log4j2 backend)."""
SPARK_KAFKA = "spark-kafka"
"""Spark's Kafka source and sink (``spark-sql-kafka-0-10_2.13`` for the pinned PySpark) and the jars
PySpark lacks for it."""
_POMS = {KAFKA: "scripts/jars/kafka/pom.xml", SPARK_KAFKA: "scripts/jars/spark-kafka/pom.xml"}


def jars_root() -> Path:
    """The folder of the installed jar sets."""
    chosen = os.environ.get(ENV, "")
    if chosen:
        return Path(chosen)
    return Path(__file__).resolve().parents[2] / ".jars"


def installed(name: str) -> list[Path]:
    """The jars of ``name`` (``KAFKA`` or ``SPARK_KAFKA``), sorted; [] when they are not installed."""
    folder = jars_root() / name
    return sorted(folder.glob("*.jar")) if folder.is_dir() else []


def require(name: str) -> list[Path]:
    """The jars of ``name``, or a ``ConfigError`` that says how to install them."""
    jars = installed(name)
    if jars:
        return jars
    msg = (f"{name} jars not found in {jars_root() / name}: ./scripts/setup.sh installs them from Maven Central "
           f"(mvn -q -B -f {_POMS[name]} package; it needs Maven and Maven Central), or set {ENV} to a folder holding "
           f"{name}/")
    raise ConfigError(msg)

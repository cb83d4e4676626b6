"""Building the Spark session the job needs: Java check, project interpreter, RocksDB state."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any

from safepoint.errors import JavaMissingError

__all__ = ["check_java", "build_session", "spark_conf"]


def check_java() -> str:
    """Return the Java version, or raise with what to install."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        msg = (
            "Java not found: Spark needs a JDK or JRE 17 or newer. Install it "
            "(Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME."
        )
        raise JavaMissingError(msg)
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    text = proc.stderr + proc.stdout
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        msg = f"cannot read the Java version from {java}: {text.strip()[:200]}"
        raise JavaMissingError(msg)
    major = int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)
    if major < 17:
        msg = f"Java {major} found at {java}; Spark 4 needs Java 17 or newer"
        raise JavaMissingError(msg)
    return f"{major}"


def spark_conf(shuffle_partitions: int, extra: dict[str, str] | None = None, ui: bool = False) -> dict[str, str]:
    conf = {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        "spark.driver.memory": "2g",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    }
    conf.update(extra or {})
    return conf


def build_session(
    master: str = "local[2]", shuffle_partitions: int = 4, app: str = "safepoint", extra: dict[str, str] | None = None,
    ui: bool = False,
) -> Any:
    """A SparkSession whose Python workers use this interpreter (they need pyarrow)."""
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master not in ("", "submit"):  # under spark-submit the master comes from the command line
        builder = builder.master(master)
    for k, v in spark_conf(shuffle_partitions, extra, ui).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark

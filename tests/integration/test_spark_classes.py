"""The class-data archive (streaming/classes.py) that setup.sh builds: every Spark JVM the project
starts maps it, so the session starts seconds sooner; the JVM's compiler (``jvm_jit``) and its
garbage collector (``jvm_gc``)."""

from __future__ import annotations

from typing import Any

import pytest

from safepoint.streaming.classes import archive_path

from observers import missing_tool

pytestmark = pytest.mark.integration


def test_the_sessions_jvm_maps_the_class_data_archive(spark: Any) -> None:
    path = archive_path()
    if path is None or not path.is_file():
        missing_tool(f"no class-data archive at {path} (scripts/setup.sh builds it: safepoint spark-classes)")
    jvm = spark.sparkContext._jvm
    mf = jvm.java.lang.management.ManagementFactory
    assert f"-XX:SharedArchiveFile={path}" in list(mf.getRuntimeMXBean().getInputArguments())
    bean = mf.getPlatformMXBean(jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    # false when the JVM could not map it (another Java or Spark): -Xshare:auto then starts without it
    assert bean.getVMOption("UseSharedSpaces").getValue() == "true"


def test_the_sessions_jvm_compiles_with_the_quick_compiler_only(spark: Any) -> None:
    """``jvm_jit = "c1"`` (the default): the session's JVM stops at tier 1, with the archive still mapped."""
    jvm = spark.sparkContext._jvm
    mf = jvm.java.lang.management.ManagementFactory
    assert "-XX:TieredStopAtLevel=1" in list(mf.getRuntimeMXBean().getInputArguments())
    bean = mf.getPlatformMXBean(jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert bean.getVMOption("TieredStopAtLevel").getValue() == "1"
    executors = spark.conf.get("spark.executor.extraJavaOptions").split()
    assert executors[0] == "-XX:TieredStopAtLevel=1", executors


def test_the_sessions_jvms_log_with_the_projects_configuration(spark: Any) -> None:
    """A local master: the JVM (driver and executors) logs with ``streaming/log4j2.properties``."""
    from safepoint.streaming.session import LOG_CONFIG

    option = f"-Dlog4j2.configurationFile={LOG_CONFIG}"
    args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert option in args, args
    assert option in spark.conf.get("spark.executor.extraJavaOptions").split()


def test_the_sessions_jvm_collects_with_the_serial_collector(spark: Any) -> None:
    """``jvm_gc = "serial"`` (the default): the session's JVM runs the serial collector; executors
    on a cluster are left to the JVM's choice."""
    jvm = spark.sparkContext._jvm
    mf = jvm.java.lang.management.ManagementFactory
    assert "-XX:+UseSerialGC" in list(mf.getRuntimeMXBean().getInputArguments())
    bean = mf.getPlatformMXBean(jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert bean.getVMOption("UseSerialGC").getValue() == "true"
    assert "GC" not in spark.conf.get("spark.executor.extraJavaOptions")

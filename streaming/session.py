"""Building the Spark session the job needs: Java check, project interpreter, RocksDB state."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from safepoint.errors import JavaMissingError
from safepoint.streaming.classes import java_options
from safepoint.streaming.java import java_binary, java_version_text

__all__ = ["GC_OPTIONS", "JIT_OPTIONS", "KAFKA_CONNECTOR", "check_java", "build_session", "kafka_connector_conf", "stop_on_signals",
           "quiet_accumulator_hangup", "spark_conf"]

DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
EXECUTOR_JAVA_OPTIONS = "spark.executor.extraJavaOptions"
LOG_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")
"""Spark's log configuration for the JVMs the project starts itself (warnings only, without the
lines normal operation prints)."""
JIT_OPTIONS = {"c1": "-XX:TieredStopAtLevel=1", "tiered": ""}
"""The ``jvm_jit`` setting's Java options. ``c1``: the JVM compiles with its quick compiler only.
On 2 cores the optimizing one (C2) took 8.6-9.2 of the JVM's 20 CPU-s from the session's start to
the end of batch 0, while the JVM does about a tenth of the job's work per event (the Python
workers and the broker the rest): with C1 only, batch 0 6.6-7.7 s against 7.8-9.5 and the session
4.0-4.4 s against 5.5-5.7 (a probe's three alternating runs each), the JVM's CPU per event in the
benchmark's throughput runs 6-7 us against 15-16. ``tiered``: the JVM's default, for executors
with cores to spare over a long run."""
GC_OPTIONS = {"serial": "-XX:+UseSerialGC", "default": ""}
"""The ``jvm_gc`` setting's Java options, for the JVM the job starts for itself (the driver, and
with a local master the executors in it). ``serial``: one collector thread and no G1 region
bookkeeping. The benchmark on 2 cores, alternating G1 and serial: latency runs at 10,000 ev/s
(three each), the JVM's resident memory 764-770 MB against 585-589 MB, the steady batches as fast
(medians 807, 639, 455 ms against 722, 528, 449 ms); ``--phases spark,scale`` (two each), the JVM
712 and 669 MB against 574 and 573 MB, the 10,000-node run's JVM and workers 1,989 and 1,973 MB
against 1,835 and 1,817 MB, the JVM's CPU per event 5 us either way. ``default``: the JVM's own
choice (G1 on a server-class machine). Not set on executors: a cluster's have cores and heap to
spare."""
LOCAL_CHECKPOINT_FS = "spark.hadoop.fs.AbstractFileSystem.file.impl"


KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13"
"""Spark's own Kafka source and sink (``source_format = "kafka"``): the Maven coordinates, without the
version, which is PySpark's."""


def kafka_connector_conf() -> dict[str, str]:
    """The Spark settings that put Spark's Kafka connector on a session's classpath: the jars setup
    installed (``.jars/spark-kafka``, ``safepoint/jars.py``), else Spark's own package resolution of
    the connector for this PySpark from Maven Central (it downloads it at the session's start)."""
    from safepoint.jars import SPARK_KAFKA, installed

    jars = installed(SPARK_KAFKA)
    if jars:
        return {"spark.jars": ",".join(str(j) for j in jars)}
    import pyspark

    return {"spark.jars.packages": f"{KAFKA_CONNECTOR}:{pyspark.__version__}"}


def check_java() -> str:
    """Return the Java version, or raise with what to install."""
    java = java_binary()
    if java is None:
        msg = (
            "Java not found: Spark needs a JDK or JRE 17 or newer. Install it "
            "(Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME."
        )
        raise JavaMissingError(msg)
    text = java_version_text(java)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        msg = f"cannot read the Java version from {java}: {text.strip()[:200]}"
        raise JavaMissingError(msg)
    major = int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)
    if major < 17:
        msg = f"Java {major} found at {java}; Spark 4 needs Java 17 or newer"
        raise JavaMissingError(msg)
    return f"{major}"


def spark_conf(shuffle_partitions: int, extra: dict[str, str] | None = None, ui: bool = False,
               driver_memory: str = "1g") -> dict[str, str]:
    conf = {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        # adaptive query execution does not run in a stateful stream: said off, Spark does not warn
        # at every start that it turned it off
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        # the daemon that forks the Python workers imports the installed PySpark, compiled once,
        # instead of the zip copy Spark puts first on their path (streaming/worker_daemon.py)
        "spark.python.daemon.module": "safepoint.streaming.worker_daemon",
        # One daemon for the read tasks and the operator's task. Spark keys its worker daemons by
        # their environment, and the read tasks' runner adds SPARK_SIMPLIFIED_TRACEBACK=1 where
        # the operator's does not: two daemons, and the operator's first task forked a worker that
        # imported everything again. With one, it takes a worker a read task left warm (batch 0's
        # operator work 3.1-3.7 -> 1.9-2.6 s with the daemon's arrow preload). The cost: a Python
        # error in a read task shows PySpark's own frames too.
        "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
        "spark.driver.memory": driver_memory,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # State compressed with zstd, not lz4: the changelog files (every batch's updates, kept
        # until a snapshot) and RocksDB's tables. The benchmark's checkpoint state/ at the end of
        # its backlog: 257 -> 152 kB (232 -> 137 B per open hold), throughput the same within its
        # noise in runs alternating the two. A checkpoint written with lz4 keeps it: Spark takes
        # the codec from the offset log (test_checkpoint_checks.py).
        "spark.sql.streaming.stateStore.compression.codec": "zstd",
        "spark.sql.streaming.stateStore.rocksdb.compression": "zstd",
        # RocksDB's tables in blocks of 64 kB, not Spark's 4: RocksDB compresses each block alone,
        # and with several clusters a bucket's value is 1.5-2.5 kB (eight clusters of 125 nodes in
        # 8 buckets: 16 nodes a value), so a 4 kB block held two or three values and zstd learned
        # their field names and timestamps again in each. The benchmark's checkpoint state/ at the
        # end of its backlog (the snapshot's table, with the changelog files the same): eight
        # clusters on 2 shuffle partitions, tables 48.2 -> 31.8 kB (144 -> 128 B per open hold);
        # one cluster, whose values are 16 kB and more, 28.8 -> 26.1 kB (99 -> 96 B). A lookup reads
        # (and caches) one block: a bucket's 64 kB at most. Tables already written keep their
        # blocks; the setting applies to the ones written after.
        "spark.sql.streaming.stateStore.rocksdb.blockSizeKB": "64",
        # The changelog files at zstd's level 9, not Spark's 1 (it sets the level of every zstd
        # stream Spark writes; shuffles keep lz4): a batch writes each touched bucket whole, tens of
        # kB, so the level costs a few ms a batch at most. The benchmark's checkpoint state/ at the
        # end of its backlog (`safepoint bench --phases spark --masters local[2] --status-off ""
        # --spark-conf spark.io.compression.zstd.level=N`): 125 kB at 1, 120 at 3, 109 at 9 (113,
        # 108, 99 B per open hold). Any level reads back alike, so a checkpoint keeps working.
        "spark.io.compression.zstd.level": "9",
        # A RocksDB snapshot of the state every 50 batches instead of 10: with changelog
        # checkpointing each batch writes only its changes, and a snapshot (a checkpoint of the
        # whole store, uploaded by the maintenance thread) competes with the batches for 2 cores.
        # Latency runs at 1,000 ev/s, alternating 10 and 50 (two each): p99 2.08, 1.77 -> 1.40,
        # 1.30 s, the slowest batch 1,564, 1,253 -> 1,006, 849 ms. A restart replays up to 50
        # small changelog files instead of 10.
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "50",
        # A checkpoint on the local disk (file:) is written through Hadoop's FileContext: without
        # a .crc file beside each offsets, commits and changelog file. In steady 1,000-node
        # batches on 2 cores: offsets 58 -> 32 ms, commits 63 -> 38, state commit 48 -> 25, each
        # batch 775 -> 723 ms. RocksDB's own files keep Hadoop's checksummed file system.
        LOCAL_CHECKPOINT_FS: "org.apache.hadoop.fs.local.RawLocalFs",
    }
    conf.update(extra or {})
    return conf


def build_session(
    master: str = "local[2]", shuffle_partitions: int = 4, app: str = "safepoint", extra: dict[str, str] | None = None,
    ui: bool = False, log_file: str | None = None, jit: str = "c1", driver_memory: str = "1g", gc: str = "serial",
) -> Any:
    """A SparkSession whose Python workers use this interpreter (they need pyarrow). With
    ``log_file``, what the JVM and its Python workers print (log4j lines, worker notices) goes to
    that file instead of this process's terminal. ``jit``: a key of ``JIT_OPTIONS`` (the
    ``jvm_jit`` setting), for the driver's JVM and the executors'; ``driver_memory`` its heap (the
    ``driver_memory`` setting); ``gc``: a key of ``GC_OPTIONS`` (the ``jvm_gc`` setting), for the
    driver's JVM."""
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):  # driver and executors in this one JVM: nothing needs more than loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    conf = spark_conf(shuffle_partitions, extra, ui, driver_memory)
    for key in (DRIVER_JAVA_OPTIONS, EXECUTOR_JAVA_OPTIONS):  # extra's own compiler choice stands
        _add_java_options(conf, key, JIT_OPTIONS[jit], unless="TieredStopAtLevel")
    _add_java_options(conf, DRIVER_JAVA_OPTIONS, GC_OPTIONS[gc], unless="GC")  # extra's own collector stands
    # the class-data archive, where one was made (streaming/classes.py), unless this JVM makes one
    _add_java_options(conf, DRIVER_JAVA_OPTIONS, java_options(), unless="ArchiveClassesAtExit")
    if master.startswith("local"):  # executors elsewhere keep their cluster's log configuration
        for key in (DRIVER_JAVA_OPTIONS, EXECUTOR_JAVA_OPTIONS):
            _add_java_options(conf, key, f"-Dlog4j2.configurationFile={LOG_CONFIG}", unless="log4j2.configurationFile")
    if master not in ("", "submit"):
        _launch_jvm_apart(master, app, conf, log_file)
    builder = SparkSession.builder.appName(app)
    if master not in ("", "submit"):  # under spark-submit the master comes from the command line
        builder = builder.master(master)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    quiet_accumulator_hangup(getattr(spark.sparkContext, "_accumulatorServer", None))
    return spark


def stop_on_signals(stopping: threading.Event | None = None) -> threading.Event:
    """Set the returned event (``stopping``, or a new one) on SIGINT or SIGTERM, in place of the handler
    a Spark session installs for SIGINT: that one cancels every job from inside whatever py4j call the
    main thread is in, which fails with a reentrant read and logs tracebacks. For a command's main
    thread: once before its session starts (a stop while it starts is a stop too), and again once it
    exists, with the same event; its loop ends when the event is set."""
    stopping = stopping if stopping is not None else threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    return stopping


def stop_session(spark: Any) -> None:
    """Stop ``spark`` without a trace on the way: the state stores' maintenance is stopped first
    (it would otherwise run once more as the context goes, and log that ``SparkEnv`` is gone)."""
    try:
        spark.sparkContext._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
    except Exception:  # noqa: BLE001, S110 - a JVM already gone: the stop below says so if it matters
        pass
    spark.stop()


def _add_java_options(conf: dict[str, str], key: str, options: str, unless: str) -> None:
    """Append ``options`` (if any) to the Java options at ``conf[key]``, unless those name ``unless``."""
    if options and unless not in conf.get(key, ""):
        conf[key] = f"{conf.get(key, '')} {options}".strip()


def quiet_accumulator_hangup(server: Any) -> None:
    """Let PySpark's accumulator server take the JVM's hang-up without a traceback.

    The JVM opens one connection to the driver's accumulator server at the first Python task and
    has no step that closes it: it closes when the JVM lets go of it, which on a loaded machine
    can come inside ``SparkContext.stop``, before PySpark tells the server to end (seen in CI and
    reproduced with both cores busy). Its handler then reads end-of-file and ``socketserver``
    prints the ``EOFError`` to stderr, so a clean stop looked like a crash. End-of-file is how that
    connection always ends; every other error is still printed.
    """
    if server is None:
        return
    default = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], EOFError):
            default(request, client_address)

    server.handle_error = handle_error


def _launch_jvm_apart(master: str, app: str, conf: dict[str, str], log_file: str | None = None) -> None:
    """Start Spark's JVM in a session of its own, as PySpark would but for that.

    A SIGTERM (or Ctrl-C) to the command's process group then reaches only Python, which stops
    the query and the session cleanly; otherwise the JVM dies with the group at once and the stop
    ends in Py4J tracebacks. The JVM still exits when this process does: PySpark's gateway watches
    its stdin pipe.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    spark_conf_ = SparkConf(loadDefaults=False).setMaster(master).setAppName(app).setAll(list(conf.items()))
    popen: dict[str, Any] = {"start_new_session": True}
    if log_file is not None:
        log = open(log_file, "ab")  # noqa: SIM115 - the JVM writes to it for as long as it runs
        popen.update(stdout=log, stderr=subprocess.STDOUT)
    gateway = launch_gateway(spark_conf_, popen_kwargs=popen)  # type: ignore[no-untyped-call]
    SparkContext._ensure_initialized(gateway=gateway, conf=spark_conf_)

"""``safepoint spark-classes``: build the class-data archive that makes Spark's JVM start faster.

The archive and how the project uses it are described in ``streaming/classes.py``. It is built
by running the job once for real on the embedded broker (a few messages, one micro-batch) in a
child process whose JVM writes every class it loaded to the archive when it exits; the file is
then moved into place in one step, so a JVM starting meanwhile sees no archive or the whole one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from safepoint.streaming.classes import ENV, archive_path
from safepoint.streaming.java import C1_ONLY

__all__ = ["make_archive"]


def make_archive(path: Path | None = None, timeout_s: float = 300) -> Path:
    """Build the archive at ``path`` (default: ``archive_path()``) by running the job once in a
    child process; returns the path. Raises ``RuntimeError`` when the run failed."""
    target = path or archive_path()
    if target is None:
        msg = f"{ENV}=off: no class-data archive is used, so none is made"
        raise RuntimeError(msg)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    env = {**os.environ, ENV: "off", "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "safepoint.devtools.spark_classes", str(tmp)], env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
        tmp.unlink(missing_ok=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        msg = f"building the class-data archive failed (exit {proc.returncode}): " + " | ".join(tail)
        raise RuntimeError(msg)
    os.replace(tmp, target)  # atomic: a JVM starting now sees no archive or the whole one
    print(f"spark-classes: {target} ({target.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - started:.0f} s",
          flush=True)
    return target


def _warm_up(dump_to: str) -> None:
    """The child: the job over a few messages on the embedded broker, in a JVM that writes the
    classes it loaded to ``dump_to`` when it exits."""
    import tempfile

    from safepoint.connectors.kafka.producer import make_producer, producer_conf
    from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
    from safepoint.devtools.broker import EmbeddedBroker
    from safepoint.settings import load_settings
    from safepoint.streaming.job import build_query
    from safepoint.streaming.session import DRIVER_JAVA_OPTIONS, build_session

    broker = EmbeddedBroker().start()
    with tempfile.TemporaryDirectory(prefix="safepoint-classes-") as work:
        settings = load_settings(flags={"bootstrap": broker.bootstrap, "status_topic": "safepoint.status"}, environ={})
        ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2))
        producer = make_producer("confluent", producer_conf(settings.librdkafka(), linger_ms=5))
        base = {"v": 1, "cluster": "warm-up", "node": "n1", "incarnation": 1}
        events = [{**base, "type": "heartbeat", "seq": 1, "wall_ms": 1_000, "mvcc_now": 100},
                  {**base, "type": "reader_open", "seq": 2, "wall_ms": 1_001, "reader_id": "r", "read_ts": 90},
                  {**base, "type": "reader_close", "seq": 3, "wall_ms": 1_002, "reader_id": "r"},
                  {"v": 1, "type": "topology", "cluster": "warm-up", "wall_ms": 1_003, "version": 1, "nodes": {"n1": []}}]
        for ev in events:
            producer.produce(settings.events_topic, key=ev.get("node", "warm-up"), value=json.dumps(ev))
        producer.produce(settings.events_topic, key="bad", value=b"{not json")
        producer.flush(30)
        # C1_ONLY: the run is a JVM's start and one batch (on 2 cores 55 s instead of 62, 54 CPU-s
        # instead of 73); the archive holds classes, not compiled code, so it serves either compiler
        spark = build_session("local[2]", 1, app="safepoint-classes",
                              extra={DRIVER_JAVA_OPTIONS: f"-XX:ArchiveClassesAtExit={dump_to} {C1_ONLY}"},
                              log_file=os.path.join(work, "spark.log"))
        query = build_query(spark, settings, os.path.join(work, "ckpt"))
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        gateway = spark.sparkContext._gateway
        spark.stop()
        proc = getattr(gateway, "proc", None)
        if proc is not None:  # the JVM exits when its stdin closes, and writes the archive first
            proc.stdin.close()
            proc.wait(120)
    broker.cleanup()


if __name__ == "__main__":
    _warm_up(sys.argv[1])

"""The benchmark's worker processes: the plain single-process consumer, and the job under Spark for throughput and latency (each in a fresh JVM), with their samplers and profilers."""

from __future__ import annotations

import heapq
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench_common import _T0, PROTO, cpu_delta, cpu_seconds, cpu_snapshot, proc_tree, rss_sample
from bench_workload import consumer, logical_state, producer

from safepoint.devtools.soak import dir_size


def worker_plain(spec: dict[str, Any]) -> int:
    import resource

    from safepoint.core import Engine, Position
    from safepoint.core.codec import encode

    bootstrap, topic, total, topics = spec["bootstrap"], spec["topic"], spec["total"], spec["topics"]
    from confluent_kafka import TopicPartition

    engine = Engine()
    # One consumer per partition, read in rounds of ``chunk`` messages each, and each round's
    # partitions merged by the messages' timestamps: the same interleaving rule as the job's
    # micro-batches (a single consumer hands over whole fetches partition by partition, and on
    # this broker a fetch is a whole partition, so the cluster's time would jump back and forth
    # and every node would look stale in turn).
    md = consumer(bootstrap, "bench-plain-md")
    parts = sorted(md.list_topics(topic, timeout=30).topics[topic].partitions)
    ends = {p: md.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
    md.close()
    cs = []
    # fetch again only when fewer than 1,000 messages are queued (librdkafka's default, 100,000,
    # would refetch at once: on the embedded broker a fetch returns the whole partition, and a fetch
    # at its end returns at once, so the client would spin; see ``idle``). Apache Kafka answers a
    # fetch with a megabyte of a partition at most and waits at its end (fetch.wait.max.ms): there
    # librdkafka's own prefetching keeps the rounds fed (with 1,000, each round waited on a fetch:
    # 21k ev/s with 0.26 of a core busy, against 127k on the embedded broker)
    extra = {} if spec.get("broker") == "kafka" else {"queued.min.messages": 1000}
    for p in parts:
        c = consumer(bootstrap, f"bench-plain-{p}", extra=extra)
        c.assign([TopicPartition(topic, p, 0)])
        cs.append(c)
    chunk = max(1, 10_000 // len(cs))
    # A partition read to the end of the backlog is paused, as the job's source unassigns at its
    # planned end: see ``idle`` for why a caught-up consumer must not keep fetching here.
    live = [(c, p) for c, p in zip(cs, parts, strict=True) if ends[p] > 0]
    prod = producer(bootstrap, linger_ms=5)
    outs: Counter[str] = Counter()
    out_bytes = 0
    broker_pid = spec.get("broker_pid")
    broker0, own0 = cpu_seconds(broker_pid), cpu_seconds(os.getpid())
    t0 = time.perf_counter()
    n = 0
    deadline = time.monotonic() + spec.get("timeout_s", 600)
    while n < total and time.monotonic() < deadline:
        runs = []
        for c, p in list(live):
            run = [m for m in c.consume(num_messages=chunk, timeout=0.05) if m.error() is None]
            if run and run[-1].offset() >= ends[p] - 1:
                c.pause(c.assignment())
                live.remove((c, p))
            runs.append(run)
        if not live and not any(runs):
            break
        for m in heapq.merge(*runs, key=lambda m: m.timestamp()[1]):
            n += 1
            for o in engine.process(m.value(), Position(topic, m.partition(), m.offset(), m.key())):
                value = encode(o.value)
                out_bytes += len(value)
                outs[o.channel] += 1
                while True:
                    try:
                        prod.produce(topics[o.channel], key=o.key, value=value)
                        break
                    except BufferError:
                        prod.poll(0.05)
        prod.poll(0)
    prod.flush(60)
    el = time.perf_counter() - t0
    broker1, own1 = cpu_seconds(broker_pid), cpu_seconds(os.getpid())
    assert own0 is not None and own1 is not None  # this process
    cpu = {"plain": own1 - own0, **({"broker": broker1 - broker0} if broker0 is not None and broker1 is not None else {})}
    for c in cs:
        c.close()
    rss_end = rss_sample(os.getpid())["driver"]
    result = {
        "events": n,
        "seconds": el,
        "events_per_s": n / el,
        "outputs": dict(outs),
        "output_bytes": out_bytes,
        "cpu_us_per_event": {k: v / n * 1e6 for k, v in cpu.items()} if n else {},
        "rss_end": rss_end,
        "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "labels": dict(engine.labels),
        "state": logical_state(engine),
        "safe_ts": {k: v.safe_ts for k, v in engine.clusters.items()},
    }
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
    return 0


def _job_settings(spec: dict[str, Any]) -> Any:
    from safepoint.settings import Settings

    t = spec["topics"]
    return Settings(
        bootstrap=spec["bootstrap"],
        checkpoint=spec["checkpoint"],
        events_topic=t["events"],
        control_topic=t["control"],
        directives_topic=t["directives"],
        alerts_topic=t["alerts"],
        deadletter_topic=t["deadletter"],
        status_topic=t["status"] if spec.get("status", True) else "",
        max_offsets_per_trigger=spec["max_offsets"],
        **({"first_batch_max_offsets": spec["first_batch"]} if "first_batch" in spec else {}),
        trigger_ms=spec["trigger_ms"],
        node_buckets=spec.get("node_buckets", Settings().node_buckets),
        spark_master=spec["master"],
        shuffle_partitions=spec["shuffle_partitions"],
        starting_offsets="earliest",
        source_format=spec.get("source_format", "python"),
    )


def _session_extra(settings: Any, spec: dict[str, Any]) -> dict[str, str]:
    """The bench's Spark settings (with ``--spark-conf``'s), with Spark's own Kafka connector where the
    run reads with it."""
    from safepoint.streaming.session import kafka_connector_conf

    extra = {"spark.sql.streaming.numRecentProgressUpdates": "10000", **(spec.get("spark_conf") or {})}
    return {**extra, **kafka_connector_conf()} if settings.source_format == "kafka" else extra


def _progress_row(p: dict[str, Any]) -> dict[str, Any]:
    ops = []
    for op in p.get("stateOperators") or []:
        ops.append(
            {
                "name": op.get("operatorName"),
                "numRowsTotal": op.get("numRowsTotal"),
                "numRowsUpdated": op.get("numRowsUpdated"),
                "memoryUsedBytes": op.get("memoryUsedBytes"),
                "allUpdatesTimeMs": op.get("allUpdatesTimeMs"),
                "commitTimeMs": op.get("commitTimeMs"),
                "custom": {k: v for k, v in (op.get("customMetrics") or {}).items() if k.startswith("rocksdb") or "Size" in k},
            }
        )
    return {
        "batchId": p.get("batchId"),
        "numInputRows": p.get("numInputRows"),
        "sparkInputRows": p.get("sparkInputRows"),
        "durationMs": p.get("durationMs"),
        "stateOperators": ops,
        "timestamp": p.get("timestamp"),
    }


def _to_dict(p: Any) -> dict[str, Any]:
    """A progress as a dict whose ``numInputRows`` counts messages (the accounting counter
    ``consumed``: with the Python source Spark's own count is of packed rows, kept as ``sparkInputRows``)."""
    from safepoint.streaming.job import messages_in

    d = p if isinstance(p, dict) else json.loads(p.json) if hasattr(p, "json") else dict(p)
    if "sparkInputRows" not in d:
        d = {**d, "sparkInputRows": d.get("numInputRows"), "numInputRows": messages_in(d)}
    return d


def new_progress(query: Any, last_b: int) -> list[dict[str, Any]]:
    """Progress of the batches after ``last_b``, in order (lastProgress, or recentProgress after a jump)."""
    lp = query.lastProgress
    if lp is None:
        return []
    d0 = _to_dict(lp)
    if d0.get("batchId") is None or d0["batchId"] <= last_b:
        return []
    if d0["batchId"] == last_b + 1:
        return [d0]
    return sorted((x for x in map(_to_dict, query.recentProgress) if x.get("batchId", -1) > last_b), key=lambda x: x["batchId"])


class _Sampler(threading.Thread):
    """RSS of the job's process tree every ``every`` s: peak and last per role."""

    def __init__(self, pid: int, every: float = 1.0) -> None:
        super().__init__(daemon=True, name="bench-sampler")
        self.pid, self.every = pid, every
        self.peak: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.series: list[tuple[float, int]] = []
        self._stop_evt = threading.Event()

    def sample(self) -> None:
        s = rss_sample(self.pid, pss=True)
        s["total"] = s["jvm"] + s["workers"] + s["driver"]
        self.last = s
        for k, v in s.items():
            self.peak[k] = max(self.peak.get(k, 0), v)
        self.series.append((round(time.monotonic() - _T0, 1), s["total"]))

    def run(self) -> None:
        while not self._stop_evt.wait(self.every):
            try:
                self.sample()
            except Exception:  # noqa: BLE001, S112 - a vanished process between listing and reading
                continue

    def stop(self) -> None:
        self._stop_evt.set()


def _start_pyspy(pid: int, out: str, rate: int) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(exe):
        return None
    cmd = [exe, "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--rate", str(rate), "--format", "raw", "--output", out]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(out + ".log", "wb"))  # noqa: SIM115


def _jdk_tool(name: str) -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", name)):
        return os.path.join(home, "bin", name)
    return shutil.which(name)


def _jfr(pid: int, action: str, out: str) -> bool:
    """Start or stop a Java Flight Recorder recording (the JDK's own sampling profiler) in the job's JVM."""
    jcmd = _jdk_tool("jcmd")
    tree = proc_tree(pid)["jvm"]
    if not jcmd or not tree:
        return False
    args = ["name=bench", "settings=profile", f"filename={out}"] if action == "start" else ["name=bench"]
    r = subprocess.run([jcmd, str(tree[0].pid), f"JFR.{action}", *args], capture_output=True, text=True, timeout=60, check=False)
    return r.returncode == 0


def worker_spark_tp(spec: dict[str, Any]) -> int:
    """Throughput: the job over the preloaded backlog until every offset is processed."""
    from safepoint.streaming.job import build_query
    from safepoint.streaming.session import build_session

    settings = _job_settings(spec)
    total = spec["total"]
    sampler = _Sampler(os.getpid())
    t0 = time.monotonic()
    spark = build_session(
        settings.spark_master, settings.shuffle_partitions, app="safepoint-bench", **settings.jvm(),
        extra=_session_extra(settings, spec),
    )
    session_s = time.monotonic() - t0
    sampler.start()
    query = build_query(spark, settings)
    seen: dict[int, dict[str, Any]] = {}
    processed = 0
    cpu0: dict[str, Any] | None = None
    t_batch0 = None
    pyspy = None
    jfr_on = False
    deadline = time.monotonic() + spec.get("timeout_s", 900)
    try:
        last_b = -1
        while processed < total:
            if not query.isActive:
                raise RuntimeError(f"the query stopped: {query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {processed} of {total} events processed in time")
            time.sleep(0.1)
            new = new_progress(query, last_b)
            for d in new:
                b = d["batchId"]
                seen[b] = d
                last_b = max(last_b, b)
                processed += int(d.get("numInputRows") or 0)
                print(f"{PROTO}" + json.dumps({"ev": "progress", "batch": b, "rows": d.get("numInputRows"),
                                                "ms": (d.get("durationMs") or {}).get("triggerExecution"),
                                                "processed": processed}), flush=True)
                if t_batch0 is None:
                    t_batch0 = time.monotonic()
                    cpu0 = cpu_snapshot(os.getpid(), spec.get("extra_pids"), spec.get("tree_pids"))
                    sampler.sample()
                    if spec.get("profile_out"):
                        pyspy = _start_pyspy(os.getpid(), spec["profile_out"], spec.get("profile_rate", 100))
                        jfr_on = _jfr(os.getpid(), "start", spec["profile_out"] + ".jfr")
        t_end = time.monotonic()
        cpu1 = cpu_snapshot(os.getpid(), spec.get("extra_pids"), spec.get("tree_pids"))
        sampler.sample()
        if jfr_on:
            _jfr(os.getpid(), "stop", spec["profile_out"] + ".jfr")
        if pyspy is not None:
            pyspy.send_signal(signal.SIGINT)
            try:
                pyspy.wait(30)
            except subprocess.TimeoutExpired:
                pyspy.kill()
        state_dir = os.path.join(settings.checkpoint, "state")
        result = {
            "master": settings.spark_master,
            "session_s": session_s,
            "total_s": t_end - t0,
            "batches": [_progress_row(seen[b]) for b in sorted(seen)],
            "after_batch0_wall_s": (t_end - t_batch0) if t_batch0 else None,
            "cpu_after_batch0": cpu_delta(cpu0 or {}, cpu1),
            "rss_peak": sampler.peak,
            "rss_end": sampler.last,
            "state_dir_bytes": dir_size(state_dir),
            "checkpoint_bytes": dir_size(settings.checkpoint),
            "profiled": pyspy is not None,
            "jfr": jfr_on,
        }
    finally:
        sampler.stop()
        if query.isActive:
            query.stop()
        spark.stop()
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
    return 0


def worker_spark_lat(spec: dict[str, Any]) -> int:
    """Latency: start the job, report progress on stdout until told ``stop`` on stdin."""
    from safepoint.streaming.job import build_query
    from safepoint.streaming.session import build_session

    settings = _job_settings(spec)
    sampler = _Sampler(os.getpid())
    t0 = time.monotonic()
    spark = build_session(settings.spark_master, settings.shuffle_partitions, app="safepoint-bench-latency",
                          **settings.jvm(), extra=_session_extra(settings, spec))
    session_s = time.monotonic() - t0
    sampler.start()
    query = build_query(spark, settings)
    print(PROTO + json.dumps({"ev": "started", "session_s": session_s}), flush=True)
    stop = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    seen: dict[int, dict[str, Any]] = {}
    processed = 0
    last_b = -1
    try:
        while not stop.is_set():
            if not query.isActive:
                print(PROTO + json.dumps({"ev": "failed", "error": str(query.exception())}), flush=True)
                return 1
            stop.wait(0.05)
            for d in new_progress(query, last_b):
                b = d["batchId"]
                last_b = max(last_b, b)
                seen[b] = d
                processed += int(d.get("numInputRows") or 0)
                print(PROTO + json.dumps({"ev": "progress", "batch": b, "rows": d.get("numInputRows"), "processed": processed,
                                          "ms": (d.get("durationMs") or {}).get("triggerExecution"), "t": time.monotonic()}),
                      flush=True)
        # lastProgress may have skipped batches; recentProgress has them all
        for p in query.recentProgress:
            d = _to_dict(p)
            if d.get("batchId") is not None:
                seen[d["batchId"]] = d
        sampler.sample()
        state_dir = os.path.join(settings.checkpoint, "state")
        result = {
            "master": settings.spark_master,
            "session_s": session_s,
            "batches": [_progress_row(seen[b]) for b in sorted(seen)],
            "rss_peak": sampler.peak,
            "rss_end": sampler.last,
            "rss_series": sampler.series,
            "state_dir_bytes": dir_size(state_dir),
            "checkpoint_bytes": dir_size(settings.checkpoint),
        }
        print(PROTO + json.dumps({"ev": "result", "result": result}), flush=True)
    finally:
        sampler.stop()
        if query.isActive:
            query.stop()
        spark.stop()
    return 0


def worker_spark_floor(spec: dict[str, Any]) -> int:
    """Spark's own floor for the job's plan shape: Spark's ``rate`` source (``rowsPerSecond``), one
    key, a Python ``transformWithState`` that reads and writes one ``ValueState`` per batch and
    returns one row, a ``noop`` sink; the job's session settings (RocksDB with changelog
    checkpointing, its shuffle partitions, its trigger) and nothing of safepoint's. Prints each
    batch's progress for ``seconds`` after ``warmup_s``."""
    from pyspark.sql import Row
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from safepoint.streaming.session import build_session

    settings = _job_settings(spec)
    spark = build_session(settings.spark_master, settings.shuffle_partitions, app="safepoint-bench-floor",
                          **settings.jvm(), extra=_session_extra(settings, spec))

    class Floor(StatefulProcessor):  # defined here: pickled by value for the workers
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", StructType([StructField("n", LongType(), False)]))

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:  # noqa: N802, N803
            n = sum(1 for _ in rows)
            have = self.count.get()
            self.count.update(((have[0] if have is not None else 0) + n,))
            yield Row(key=key[0], n=n)

        def close(self) -> None:
            pass

    out = StructType([StructField("key", StringType(), False), StructField("n", LongType(), False)])
    rows = (spark.readStream.format("rate").option("rowsPerSecond", str(spec["rate"])).load()
            .select(F.lit("default").alias("cluster"), F.col("value")))
    query = (rows.groupBy("cluster").transformWithState(statefulProcessor=Floor(), outputStructType=out,
                                                        outputMode="Append", timeMode="None")
             .writeStream.format("noop").option("checkpointLocation", settings.checkpoint)
             .trigger(processingTime=f"{settings.trigger_ms} milliseconds").start())
    try:
        time.sleep(spec["warmup_s"])
        first = max((_to_dict(p).get("batchId") or 0 for p in query.recentProgress), default=0)
        time.sleep(spec["seconds"])
        batches = [_progress_row(d) for d in (_to_dict(p) for p in query.recentProgress)
                   if (d.get("batchId") or 0) > first]
    finally:
        query.stop()
        spark.stop()
    Path(spec["result"]).write_text(json.dumps({"batches": batches}), encoding="utf-8")
    return 0

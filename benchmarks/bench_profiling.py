"""The benchmark's profiles: cProfile of the core and of the job's batch logic run without Spark, and the py-spy and JFR samples of a job run, grouped by where the time goes."""

from __future__ import annotations

import cProfile
import pstats
import subprocess
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from bench_workers import _jdk_tool


def _top_stats(prof: cProfile.Profile, us_per_event: float, n: int = 12) -> list[dict[str, Any]]:
    """Top functions by self time, as a share of all profiled time and scaled to the unprofiled cost."""
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values()) or 1.0  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        short = file.split("site-packages/")[-1].split("/main/")[-1]
        rows.append({"func": f"{func} ({short}:{line})", "calls": nc, "self_share": tt / total,
                     "self_us_per_event": tt / total * us_per_event})
    return sorted(rows, key=lambda r: -r["self_share"])[:n]


def _cum_for(prof: cProfile.Profile, us_per_event: float, names: list[str]) -> dict[str, float]:
    """Cumulative time of the named functions ("file-suffix:func"), as a share of all profiled time scaled
    to the unprofiled cost per event (cProfile roughly doubles the cost; shares hold up better)."""
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values()) or 1.0  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for (file, _line, func), (_cc, _nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        for name in names:
            mod, _, fn = name.rpartition(":")
            if fn == func and file.endswith(mod):
                out[name] = out.get(name, 0.0) + ct / total * us_per_event
    return out


def profile_plain(values: list[bytes]) -> dict[str, Any]:
    """The core alone (Engine.process per message, outputs encoded), timed and under cProfile."""
    from safepoint.core import Engine, Position
    from safepoint.core.codec import encode

    def run() -> float:
        eng = Engine()
        t = time.perf_counter()
        for i, v in enumerate(values):
            for o in eng.process(v, Position("t", 0, i)):
                encode(o.value)
        return time.perf_counter() - t

    plain_s = run()
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    n = len(values)
    return {
        "events": n,
        "us_per_event": plain_s / n * 1e6,
        "events_per_s": n / plain_s,
        "top_self": _top_stats(prof, plain_s / n * 1e6),
        "cumulative_us_per_event": _cum_for(prof, plain_s / n * 1e6, [
            "engine.py:step", "events.py:parse", "node.py:apply", "cluster.py:apply_node_update", "cluster.py:evaluate",
            "cluster.py:problems", "cluster.py:_directive", "codec.py:encode", "node.py:_pressure",
        ]),
    }


BATCH_PARTS = ("route", "unpack", "parse", "state_in", "run", "encode", "state_out")
"""The parts of a batch ``operator_passes`` times: the router (before the shuffle), then the operator's
unpacking, its parse (``admit``), the cluster's state read (``stored_cluster``), the batch through
the rules (``run_batch``: the nodes' buckets read as touched, the status parts made), the outputs
encoded as the operator sends them, and the state written (``written_cluster``, ``written_buckets``)."""


def operator_passes(values: list[tuple[str, bytes]], batch_rows: int, partitions: int, policy: Any,
                    prof: cProfile.Profile | None = None, skip: int = 0, keep: bool = True) -> dict[str, Any]:
    """The job's batch logic over ``values`` in batches of ``batch_rows`` (core/batch.py: route per
    partition, each node event's record named by its header and handed through unread, as a node
    client sends it; then each cluster's batch parsed (``admit``) and through ``run_batch``, its
    outputs encoded, with the stored values and the packed hand-off between them,
    streaming/stored.py) in this process, without Spark; the collector paused, as the operator
    pauses it. With ``keep``, the states it wrote are kept for the next batch as the operator keeps
    them (``stored.KEPT``: taken as they are while the store holds the bytes they were written as),
    else every batch decodes what it reads. Seconds by part (``BATCH_PARTS``) over the batches
    after the first ``skip`` (whose states are still growing), those batches, their events, the
    outputs and the state's bytes."""
    import gc
    import uuid

    from bench_workload import record_headers

    from safepoint.core.batch import admit, header_cluster, route_records, run_batch
    from safepoint.core.codec import encode
    from safepoint.streaming.stored import (
        Kept,
        pack_group,
        stored_cluster,
        stored_nodes,
        unpack_groups,
        written_buckets,
        written_cluster,
    )

    kept = Kept() if keep else None
    scope = uuid.uuid4().hex

    buckets = 8
    offsets = [0] * partitions
    msgs: list[tuple[int, int, bytes, bytes, Any]] = []
    for key, value in values:
        p = zlib.crc32(key.encode()) % partitions
        msgs.append((p, offsets[p], key.encode(), value, record_headers(value)))
        offsets[p] += 1
    topics = {"events": "bench", "control": "bench.control"}
    seconds = dict.fromkeys(BATCH_PARTS, 0.0)
    clusters: dict[str, bytes] = {}
    nodes: dict[tuple[str, int], bytes] = {}
    outs = timed = events = 0
    enabled = gc.isenabled()
    gc.disable()
    if prof is not None:
        prof.enable()
    try:
        for index, start in enumerate(range(0, len(msgs), batch_rows)):
            batch = msgs[start:start + batch_rows]
            took = dict.fromkeys(BATCH_PARTS, 0.0)
            t = time.perf_counter()
            blobs: dict[str, list[bytes]] = {}
            for part in range(partitions):  # one router call per Kafka partition, as the read tasks do
                rows = [(*m[:4], None, header_cluster(m[4])) for m in batch if m[0] == part]
                for cluster, group in route_records(rows, "bench", policy).items():
                    blobs.setdefault(cluster, []).append(pack_group(group))
            t = _lap(took, "route", t)
            for cluster, packed in blobs.items():
                group = unpack_groups(packed)
                t = _lap(took, "unpack", t)
                items = group.routed + admit(cluster, group.raw, topics, policy)
                t = _lap(took, "parse", t)
                stored = clusters.get(cluster)
                state = None if stored is None else stored_cluster(cluster, stored, kept, scope)
                t = _lap(took, "state_in", t)
                read = stored_nodes(cluster, buckets, lambda b, c=cluster: nodes.get((c, b)), kept, scope)
                result = run_batch(cluster, state, read, items, policy, False)
                t = _lap(took, "run", t)
                for _channel, _key, value in result.outputs:
                    encode(value)
                t = _lap(took, "encode", t)
                if result.cluster is not None:
                    clusters[cluster] = written_cluster(result.cluster, kept, scope)
                nodes.update({(cluster, b): v for b, v in written_buckets(read, result.buckets, buckets, kept, scope).items()})
                t = _lap(took, "state_out", t)
                outs += len(result.outputs)
            if index >= skip:
                timed += 1
                events += len(batch)
                for part, spent in took.items():
                    seconds[part] += spent
    finally:
        if prof is not None:
            prof.disable()
        if enabled:
            gc.enable()
    return {"seconds": seconds, "batches": timed, "events": events, "outputs": outs,
            "state_bytes": sum(len(v) for v in clusters.values()) + sum(len(v) for v in nodes.values())}


def _lap(took: dict[str, float], part: str, since: float) -> float:
    now = time.perf_counter()
    took[part] += now - since
    return now


def profile_processors(values: list[tuple[str, bytes]], batch_rows: int, partitions: int) -> dict[str, Any]:
    """``operator_passes`` timed, and a second pass under cProfile. What is left between this and
    the job's real rate is Spark's own cost (Arrow between JVM and Python, the shuffle, RocksDB,
    the source and sink)."""
    from safepoint.core.policy import Policy

    policy = Policy()
    timed = operator_passes(values, batch_rows, partitions, policy)
    prof = cProfile.Profile()
    operator_passes(values, batch_rows, partitions, policy, prof)
    fs, n = timed["seconds"], timed["events"]
    route = fs["route"]
    total = sum(fs.values())
    return {
        "events": n,
        "batch_rows": batch_rows,
        "route_us_per_event": route / n * 1e6,
        "operator_us_per_event": (total - route) / n * 1e6,
        "total_us_per_event": total / n * 1e6,
        "events_per_s": n / total,
        "outputs": timed["outputs"],
        "state_value_bytes": timed["state_bytes"],
        "top_self": _top_stats(prof, total / n * 1e6),
        "cumulative_us_per_event": _cum_for(prof, total / n * 1e6, [
            "events.py:parse", "engine.py:step", "node.py:apply", "stored.py:bucket_entries", "node.py:from_stored", "stored.py:encode_bucket",
            "cluster.py:apply_node_update", "stored.py:decode_cluster", "stored.py:encode_cluster",
            "cluster.py:_directive", "codec.py:encode", "batch.py:merge_log_order", "batch.py:route_records", "batch.py:admit",
            "batch.py:run_batch", "json/__init__.py:dumps", "json/__init__.py:loads",
        ]),
    }


def batch_cost(values: list[tuple[str, bytes]], sizes: tuple[int, ...], partitions: int,
               skip: int = 4) -> list[dict[str, Any]]:
    """The operator's cost per batch at the latency runs' batch sizes (``sizes``: events per batch,
    e.g. 1,000 and 10,000 ev/s at the trigger), by part (``operator_passes``), with the status on
    and off (``status_holds`` 0: no status parts), and with every state decoded as read (no kept
    states: a batch on another worker than the last, or after a restart): what a batch costs besides
    its events is the part that does not shrink with them. Each size over the same events, after
    ``skip`` batches."""
    from safepoint.core.policy import Policy

    def operator_ms(passes: dict[str, Any]) -> float:
        return sum(v for part, v in passes["seconds"].items() if part != "route") / passes["batches"] * 1e3

    out = []
    for rows in sizes:
        n = min(len(values), rows * (skip + 12))
        on = operator_passes(values[:n], rows, partitions, Policy(), skip=skip)
        off = operator_passes(values[:n], rows, partitions, Policy(status_holds=0), skip=skip)
        decoded = operator_passes(values[:n], rows, partitions, Policy(), skip=skip, keep=False)
        ms = {part: v / on["batches"] * 1e3 for part, v in on["seconds"].items()}
        out.append({"batch_rows": rows, "batches": on["batches"], "ms_per_batch": ms,
                    "operator_ms": operator_ms(on), "status_off_operator_ms": operator_ms(off),
                    "decoded_operator_ms": operator_ms(decoded),
                    "decoded_ms_per_batch": {part: v / decoded["batches"] * 1e3 for part, v in decoded["seconds"].items()},
                    "us_per_event": sum(ms.values()) / rows * 1e3})
    return out


_PYSPY_GROUPS = [
    # (label, predicate over one frame "func (file:line)"); the deepest matching frame of a sample wins
    ("safepoint core: parse + validate (core/events.py)", lambda f: "safepoint/core/events.py" in f or "fastjsonschema" in f),
    ("safepoint core: node rules (core/node.py, bands)", lambda f: "safepoint/core/node.py" in f or "safepoint/core/bands.py" in f),
    ("safepoint core: cluster round (core/cluster.py)", lambda f: "safepoint/core/cluster.py" in f or "safepoint/core/sortedpairs.py" in f),
    ("safepoint core: engine glue, outputs, codec", lambda f: "safepoint/core/" in f),
    ("batch logic: routing, staging, state JSON, log-order merge (core/batch.py)", lambda f: "safepoint/core/batch.py" in f),
    ("processors: packing rows, Row fields (streaming/processors.py)", lambda f: "streaming/processors.py" in f),
    ("source: Kafka read (kafka_source.py read)", lambda f: "kafka_source.py" in f and f.startswith(("read ", "KafkaStreamReader.read "))),
    ("Kafka produce (kafka_sink.py deliver)", lambda f: "kafka_sink.py" in f),
    ("source: driver-side offsets, planning, commit (kafka_source.py)", lambda f: "kafka_source.py" in f),
    ("pyspark: Arrow -> Row, cell by cell (worker.py generate_data_batches)", lambda f: "generate_data_batches" in f),
    ("pyspark: Row -> Arrow of the outputs (worker.py convert_results)", lambda f: "convert_results" in f),
    ("pyspark: state API client (ValueState get/update: socket round trips to the JVM)",
     lambda f: "stateful_processor" in f or "state_api" in f or "value_state" in f),
    ("pyspark: Arrow/pickle serializers, Row class", lambda f: "serializers.py" in f or "pyspark/sql/types.py" in f
     or "conversion.py" in f),
    ("pyspark daemon: gc.collect() after every task (daemon.py manager)", lambda f: f.startswith("manager (") and "daemon.py" in f),
]


_PYSPY_FALLBACK = [  # only when no frame of the sample matches a group above
    ("pyarrow", lambda f: "pyarrow" in f),
    ("pyspark: worker setup, other", lambda f: "pyspark" in f),
]


def classify(frames_leaf_first: list[str], groups: list[Any], fallback: list[Any]) -> str:
    """The group of the deepest frame matching a specific group, else of the deepest matching a fallback."""
    for rules in (groups, fallback):
        for f in frames_leaf_first:
            for label, pred in rules:
                if pred(f):
                    return str(label)
    return "other"


def parse_pyspy(path: Path, rate: int, seconds: float | None) -> dict[str, Any]:
    """py-spy raw (collapsed) stacks of the job's Python processes (the bench driver itself left out).

    Each sample goes to the group of its deepest frame that matches one; top self frames and the
    process kinds (executor workers, data source runners) come along.
    """
    if not path.exists():
        return {"error": "no py-spy output"}
    groups: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    procs: Counter[str] = Counter()
    pids: set[str] = set()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        heads = [f for f in frames if f.startswith("process ")]
        inner = heads[-1] if heads else "?"
        if "benchmarks/bench.py" in inner:
            continue  # the bench driver (sampling psutil, py4j): not the job
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        kind = "executor workers (pyspark.worker)" if "pyspark.worker" in inner else (
            inner.split("pyspark.sql.worker.")[-1].split('"')[0] if "pyspark.sql.worker." in inner else "other")
        procs[kind] += n
        pids.add(inner.split(":")[0])
        total += n
        leaf[_short(frames[-1])] += n
        for f in set(frames):
            incl[_short(f)] += n
        groups[classify(frames[::-1], _PYSPY_GROUPS, _PYSPY_FALLBACK)] += n
    res: dict[str, Any] = {
        "samples": total,
        "rate_hz": rate,
        "processes": len(pids),
        "by_process_kind": dict(procs),
        "groups": [(k, v, v / total if total else 0) for k, v in groups.most_common()],
        "top_self": [(k, v, v / total if total else 0) for k, v in leaf.most_common(15)],
        "top_inclusive": [(k, v, v / total if total else 0) for k, v in incl.most_common(30)],
    }
    if seconds:
        res["busy_python_processes"] = total / rate / seconds
    return res


_JFR_GROUPS = [
    ("RocksDB (JNI calls)", lambda f: f.startswith("org.rocksdb.")),
    ("state store: RocksDB provider, changelog, snapshot upload", lambda f: ".execution.streaming.state." in f),
    ("transformWithState: JVM side of the Python state API (state server)", lambda f: "StateServer" in f or "StatefulProcessorHandleImpl" in f),
    ("Arrow (JVM side)", lambda f: f.startswith("org.apache.arrow.")),
    ("Python runner: Arrow streams to and from the Python workers", lambda f: ".execution.python." in f or ".api.python." in f),
    ("from_json (Jackson)", lambda f: "jackson" in f or "JsonToStructs" in f or ".catalyst.json." in f),
    ("shuffle: sort, serialize, compress, read/write", lambda f: ".shuffle." in f or "ExternalSorter" in f or "net.jpountz" in f
     or "com.github.luben" in f or "io.netty" in f or ".storage." in f or "UnsafeRowSerializer" in f),
    ("generated code (projections, sorts, aggregates)", lambda f: "GeneratedClass" in f or "generated" in f.lower()),
    ("query planning, analysis, optimizer (driver)", lambda f: ".catalyst.optimizer." in f or ".catalyst.analysis." in f
     or ".catalyst.rules." in f or "QueryExecution" in f or ".catalyst.trees." in f or "IncrementalExecution" in f),
    ("codegen: generating and compiling code (per batch)", lambda f: "CodeGenerator" in f or "CodegenContext" in f
     or "CodeFormatter" in f or "janino" in f or "codehaus" in f),
    ("scheduler: tasks, task results, DAG", lambda f: ".scheduler." in f or "DirectTaskResult" in f or "TaskRunner" in f
     and "runWorker" not in f),
    ("closure cleaning, task serialization", lambda f: "ClosureCleaner" in f or "JavaSerializer" in f or ".serializer." in f),
    ("listeners, progress, logging", lambda f: ".status." in f or "Logging" in f or "ProgressReporter" in f or "ListenerBus" in f),
    ("Spark streaming engine (driver: offsets, commits, progress)", lambda f: ".execution.streaming." in f),
]


_JFR_FALLBACK = [
    ("rows: UnsafeRow, UTF8String, projections (Spark, other)", lambda f: f.startswith("org.apache.spark.")),
    ("sockets, NIO", lambda f: f.startswith(("sun.nio.", "java.net.", "sun.net."))),
    ("Scala, JDK", lambda f: True),
]


def parse_jfr(path: Path) -> dict[str, Any]:
    """Java Flight Recorder execution samples by group (deepest matching frame) and thread kind, plus GC pauses."""
    jfr = _jdk_tool("jfr")
    if not jfr or not path.exists():
        return {"error": "no JFR recording"}
    r = subprocess.run([jfr, "print", "--events", "jdk.ExecutionSample", "--stack-depth", "48", str(path)],
                       capture_output=True, text=True, timeout=300, check=False)
    groups: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    frames: list[str] = []
    thread = ""
    in_stack = False
    for line in r.stdout.splitlines():
        t = line.strip()
        if t.startswith("sampledThread = "):
            thread = t
        elif t.startswith("stackTrace = ["):
            in_stack, frames = True, []
        elif in_stack and t == "]":
            in_stack = False
            if not frames:
                continue
            total += 1
            threads["executor task threads" if "Executor task launch" in thread else "driver and other threads"] += 1
            leaf[frames[0]] += 1
            groups[classify(frames, _JFR_GROUPS, _JFR_FALLBACK)] += 1
        elif in_stack and t and t != "...":
            frames.append(t.split("(")[0].strip())
    g = subprocess.run([jfr, "print", "--events", "jdk.GarbageCollection", str(path)], capture_output=True, text=True,
                       timeout=300, check=False)
    pauses_ms = 0.0
    n_gc = 0
    for line in g.stdout.splitlines():
        t = line.strip()
        if t.startswith("sumOfPauses = "):
            n_gc += 1
            val = t.split("=", 1)[1].strip()
            num = float(val.split()[0].replace(",", ""))
            pauses_ms += num * ({"s": 1000.0, "ms": 1.0, "us": 0.001, "ns": 1e-6}.get(val.split()[1], 1.0) if " " in val else 1.0)
    return {
        "samples": total,
        "by_thread": dict(threads),
        "groups": [(k, v, v / total if total else 0) for k, v in groups.most_common()],
        "top_self": [(k, v, v / total if total else 0) for k, v in leaf.most_common(12)],
        "gc_count": n_gc,
        "gc_pauses_ms": pauses_ms,
    }


def _short(frame: str) -> str:
    name, _, loc = frame.partition(" (")
    loc = loc.rstrip(")")
    for cut in ("site-packages/", "/main/", "python3.11/"):
        if cut in loc:
            loc = loc.split(cut)[-1]
    return f"{name} ({loc})"

"""``safepoint soak``: the simulator and the job together for a set time, then an independent check.

One process runs everything on this machine: the embedded broker, a simulated cluster publishing a
steady mix of short and long readers, transactions (some prepared), node restarts and now and then
a bad message (poison or duplicate), and the streaming job on a temporary checkpoint. Every
``sample_s`` it records the resident memory of the job's processes (the JVM, the Python workers
under it, and this driver process) and the size of the checkpoint's state. At the end the
simulator stops, the job drains what is left (``processAllAvailable``) and stops, and
``safepoint.devtools.checker`` reads every topic back and checks safety, order, liveness and accounting
with a model of its own. Exit status: 0 when every check passes, 1 when safety fails, 3 when
safety holds but liveness or accounting fails, 2 when the run could not be made.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from safepoint.devtools.check_kafka import check_kafka
from safepoint.devtools.check_result import CheckResult
from safepoint.errors import SafepointError
from safepoint.ops.audit import follow_and_audit
from safepoint.settings import Settings

__all__ = ["SoakConfig", "Sample", "run_soak", "sample_processes", "dir_size", "growth", "format_report"]

FLAT_GROWTH = 0.20
"""A figure is flat after warm-up when it grew by less than this (see ``growth``)."""


@dataclass(frozen=True)
class SoakConfig:
    duration_s: float = 300.0
    nodes: int = 5
    rate: float = 200.0
    bad_rate: float = 0.002
    seed: int = 0
    sample_s: float = 10.0
    long_reader_share: float = 0.001
    """Share of readers that stay open 8-30 s (the rest: 5-400 ms): one every ten seconds or so at 200 events/s."""
    restart_per_node_per_min: float = 0.5
    min_batches_to_retain: int = 20
    """spark.sql.streaming.minBatchesToRetain for the soak (Spark's default: 100). The checkpoint keeps
    the files of this many batches, so its size levels off after them plus a maintenance pass: a
    short window lets a few minutes tell real state growth from file retention."""
    policy: dict[str, Any] = field(
        default_factory=lambda: {
            "retention": 1_000_000,
            "node_lease_ms": 10_000,
            "directive_interval_ms": 1_000,
            "reader_age_warning_ms": 20_000,
            "reader_age_critical_ms": 60_000,
        }
    )


@dataclass(frozen=True)
class Sample:
    t_s: float
    """Seconds since the simulator started."""
    jvm_rss: int
    workers_rss: int
    driver_rss: int
    state_bytes: int
    checkpoint_bytes: int
    workers: int
    batch: int | None = None
    """The job's last completed micro-batch, None before the first."""


def sample_processes() -> dict[str, int]:
    """RSS of this process's children by role: the JVM(s), the Python workers, the broker."""
    import psutil

    me = psutil.Process(os.getpid())
    out = {"jvm": 0, "workers": 0, "workers_n": 0, "broker": 0, "driver": me.memory_info().rss}
    for child in me.children(recursive=True):
        try:
            name = child.name().lower()
            rss = child.memory_info().rss
            cmd = " ".join(child.cmdline()).lower()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if "java" in name:
            out["jvm"] += rss
        elif "noida" in name or "noida" in cmd:
            out["broker"] += rss
        elif "python" in name or "pyspark" in cmd:
            out["workers"] += rss
            out["workers_n"] += 1
    return out


def dir_size(path: str | Path) -> int:
    """Bytes of the files under ``path`` (du, apparent size); 0 when it does not exist yet."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                continue  # the job removed it meanwhile
    return total


def growth(samples: list[Sample], attr: str, min_batch: int = 0) -> float | None:
    """Growth of ``attr`` after warm-up: the mean of the last third of the job's processing time
    against the mean of the middle third (the first third is warm-up). Processing time starts at
    the first sample taken once batch ``min_batch`` completed (for the checkpoint's state: once
    the window of retained batches has filled, before which it grows by construction); a mean
    smooths the saw-tooth of files that maintenance deletes now and then. None when a third has
    no sample."""
    running = [s for s in samples if s.batch is not None and s.batch >= min_batch] or samples
    if len(running) < 3:
        return None
    t0, t1 = running[0].t_s, running[-1].t_s
    third = (t1 - t0) / 3
    middle: list[int] = [getattr(s, attr) for s in running if t0 + third <= s.t_s < t0 + 2 * third]
    last: list[int] = [getattr(s, attr) for s in running if s.t_s >= t0 + 2 * third]
    if not middle or not last or sum(middle) <= 0:
        return None
    return (sum(last) / len(last)) / (sum(middle) / len(middle)) - 1.0


class _Accounting:
    """Sums the job's per-batch ``accounting`` observed metrics when the job defines them."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.batches = 0

    def attach(self, spark: Any) -> None:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        outer = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:  # noqa: N802
                pass

            def onQueryProgress(self, event: Any) -> None:  # noqa: N802
                metrics = (event.progress.observedMetrics or {}).get("accounting")
                if metrics is None:
                    return
                outer.batches += 1
                for k, v in metrics.asDict().items():
                    outer.totals[k] = outer.totals.get(k, 0) + int(v or 0)

            def onQueryIdle(self, event: Any) -> None:  # noqa: N802
                pass

            def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
                pass

        spark.streams.addListener(Listener())


def run_soak(cfg: SoakConfig, report_path: str | None = None, out: Any = None) -> int:
    """Run the soak and print its report. Returns the exit status (see the module doc)."""
    from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
    from safepoint.devtools.broker import EmbeddedBroker
    from safepoint.devtools.simulate import SimConfig, run_simulator
    from safepoint.streaming.job import build_query
    from safepoint.streaming.session import build_session, check_java, stop_session

    out = out or sys.stdout
    check_java()
    workdir = tempfile.mkdtemp(prefix="safepoint-soak-")
    checkpoint = os.path.join(workdir, "checkpoint")
    spark_log = os.path.join(workdir, "spark.log")
    broker = EmbeddedBroker(data_dir=os.path.join(workdir, "broker"))
    spark = query = None
    samples: list[Sample] = []
    accounting = _Accounting()
    try:
        broker.start()
        settings = replace(Settings(), bootstrap=broker.bootstrap, checkpoint=checkpoint, **cfg.policy)
        ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), settings.events_partitions))
        sim_cfg = SimConfig(
            nodes=cfg.nodes,
            rate=cfg.rate,
            long_reader_share=cfg.long_reader_share,
            restart_per_node_per_min=cfg.restart_per_node_per_min,
            bad_rate=cfg.bad_rate,
        )
        print(
            f"soak: {cfg.duration_s:.0f} s, {cfg.nodes} nodes, {cfg.rate:.0f} events/s, bad rate {cfg.bad_rate}, "
            f"broker {broker.bootstrap}, checkpoint {checkpoint}",
            file=out,
            flush=True,
        )
        sim_rc: list[int] = []
        sim = threading.Thread(
            target=lambda: sim_rc.append(
                run_simulator(broker.bootstrap, settings.events_topic, sim_cfg, cfg.duration_s, cfg.seed, quiet_output=True)
            ),
            name="soak-simulator",
            daemon=True,
        )
        start = time.monotonic()
        sim.start()
        audit_stop = threading.Event()
        audit_box: list[Any] = []
        auditor = threading.Thread(target=lambda: audit_box.append(follow_and_audit(settings, stop=audit_stop, out=out)),
                                   name="soak-audit", daemon=True)
        auditor.start()
        spark = build_session(
            settings.spark_master,
            settings.shuffle_partitions,
            app="safepoint-soak",
            extra={
                "spark.sql.streaming.minBatchesToRetain": str(cfg.min_batches_to_retain),
                "spark.sql.streaming.stateStore.maintenanceInterval": "10s",
            },
            log_file=spark_log,
            **settings.jvm(),
        )
        try:
            accounting.attach(spark)
        except Exception as exc:  # noqa: BLE001 - the figures are a bonus; the checker does the accounting
            print(f"soak: no job accounting listener ({exc})", file=out)
        query = running = build_query(spark, settings)
        state_dir = os.path.join(checkpoint, "state")

        def sample() -> Sample:
            procs = sample_processes()
            prog = running.lastProgress
            s = Sample(
                t_s=round(time.monotonic() - start, 1),
                jvm_rss=procs["jvm"],
                workers_rss=procs["workers"],
                driver_rss=procs["driver"],
                state_bytes=dir_size(state_dir),
                checkpoint_bytes=dir_size(checkpoint),
                workers=procs["workers_n"],
                batch=prog["batchId"] if prog else None,
            )
            samples.append(s)
            return s

        every = min(cfg.sample_s, max(2.0, cfg.duration_s / 8))  # short runs still get several samples
        next_sample = time.monotonic()
        while sim.is_alive():
            if not query.isActive:
                print(f"soak: the job stopped during the run: {query.exception()}", file=out, flush=True)
                return 2
            if time.monotonic() >= next_sample:
                s = sample()
                next_sample = max(next_sample + every, time.monotonic())
                batch = "starting" if s.batch is None else f"batch {s.batch}"
                print(
                    f"soak: t+{s.t_s:5.0f}s {batch}: jvm {_mb(s.jvm_rss)}, workers {_mb(s.workers_rss)} ({s.workers}), "
                    f"driver {_mb(s.driver_rss)}, state {_mb(s.state_bytes)}, checkpoint {_mb(s.checkpoint_bytes)}",
                    file=out,
                    flush=True,
                )
            sim.join(min(1.0, max(0.05, next_sample - time.monotonic())))
        run_s = time.monotonic() - start
        print("soak: simulator stopped; draining the job ...", file=out, flush=True)
        query.processAllAvailable()
        sample()
        drained_s = time.monotonic() - start - run_s
        query.stop()
        query = None
        stop_session(spark)
        spark = None
        audit_stop.set()  # the live auditor finishes once it read what the job wrote
        auditor.join(120)
        audit = audit_box[0] if audit_box else None
        print("soak: job stopped; checking the topics ...", file=out, flush=True)
        check_start = time.monotonic()
        policy = settings.policy()
        result = check_kafka(
            settings.librdkafka(),
            settings.topics(),
            retention=policy.retention,
            node_lease_ms=policy.node_lease_ms,
            directive_interval_ms=policy.directive_interval_ms,
            warmup_ms=int(min(cfg.duration_s / 3, 60.0) * 1000),
            incarnation_grace_ms=policy.incarnation_grace_ms,
        )
        check_s = time.monotonic() - check_start
        report = _report(cfg, result, samples, run_s, drained_s, check_s, accounting, sim_rc)
        report["spark_log"] = spark_log_counts(spark_log)
        report["audit"] = None if audit is None else {
            "directives_checked": audit.checked, "holds_checked": audit.holds_checked, "excused": audit.excused,
            "unverified": audit.unverified, "violations": len(audit.violations)}
        print(format_report(report), file=out, flush=True)
        if report_path:
            Path(report_path).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        if not result.safety_ok or audit is None or audit.violations:
            return 1
        return 0 if result.liveness_ok and result.accounting_ok else 3
    except SafepointError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failed run is exit 2, never mistaken for a safety failure (1)
        traceback.print_exc()
        print(f"soak: the run failed: {exc}", file=out, flush=True)
        return 2
    finally:
        if query is not None and query.isActive:
            query.stop()
        if spark is not None:
            stop_session(spark)
        broker.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def _mb(n: int | float | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 1e6:.0f} MB" if n >= 10e6 else f"{n / 1e3:.0f} kB"


def _report(
    cfg: SoakConfig,
    result: CheckResult,
    samples: list[Sample],
    run_s: float,
    drained_s: float,
    check_s: float,
    accounting: _Accounting,
    sim_rc: list[int],
) -> dict[str, Any]:
    first = samples[0] if samples else None
    last = samples[-1] if samples else None
    flat: dict[str, Any] = {}
    for attr in ("jvm_rss", "workers_rss", "driver_rss", "state_bytes"):
        g = growth(samples, attr, cfg.min_batches_to_retain if attr == "state_bytes" else 0)
        flat[attr] = {
            "start": getattr(first, attr) if first else None,
            "end": getattr(last, attr) if last else None,
            "growth_after_warmup": g,
            "flat": g is not None and g < FLAT_GROWTH,
        }
    return {
        "config": {k: v for k, v in cfg.__dict__.items()},
        "duration_s": round(run_s, 1),
        "drain_s": round(drained_s, 1),
        "check_s": round(check_s, 1),
        "simulator_exit": sim_rc[0] if sim_rc else None,
        "events": result.messages,
        "events_per_s": round(result.messages / run_s, 1) if run_s else None,
        "check": result.to_dict(),
        "job_accounting": accounting.totals or None,
        "samples": [s.__dict__ for s in samples],
        "flat": flat,
        "safety_ok": result.safety_ok,
        "liveness_ok": result.liveness_ok,
        "accounting_ok": result.accounting_ok,
        "flat_ok": all(v["flat"] for k, v in flat.items() if k != "driver_rss"),
    }


_LOG_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|ERROR) (\S+?):")


def spark_log_counts(path: str) -> dict[str, Any]:
    """What Spark's JVM logged during the run (``streaming/log4j2.properties`` leaves out its normal
    operation): warnings and errors, by level and logger, and stack traces (``\tat`` frames' heads)."""
    counts: dict[str, int] = {}
    warnings = errors = traces = 0
    in_trace = False
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        found = _LOG_LINE.match(line)
        if found:
            level, logger = found.groups()
            warnings += level == "WARN"
            errors += level == "ERROR"
            key = f"{level} {logger}"
            counts[key] = counts.get(key, 0) + 1
        is_frame = line.startswith(("\tat ", "        at "))
        if is_frame and not in_trace:
            traces += 1
        in_trace = is_frame
    return {"warnings": warnings, "errors": errors, "traces": traces, "by_logger": counts}


def format_report(report: dict[str, Any]) -> str:
    """The short text report (the JSON report has every figure)."""
    c = report["check"]
    lines = ["", "== safepoint soak report"]
    lines.append(
        f"duration: {report['duration_s']} s (+ drain {report['drain_s']} s, check {report['check_s']} s)   "
        f"events: {report['events']} ({report['events_per_s']}/s)"
    )
    lines.append(
        f"messages: {c['messages']} = applied {c['applied']} + ignored {c['ignored']} + bad {c['bad']}; "
        f"dead letters: {c['dead_letters']} (missing {c['dead_letters_missing']}, unexpected {c['dead_letters_unexpected']}, "
        f"repeated {c['dead_letter_duplicates']})"
    )
    if report.get("job_accounting"):
        ja = report["job_accounting"]
        lines.append(
            f"job accounting: consumed {ja.get('consumed')} = applied {ja.get('applied')} + ignored {ja.get('ignored')} "
            f"+ dead-lettered {ja.get('deadlettered')}"
        )
    lines.append(
        f"directives: {c['directives']} compaction (repeated {c['directive_duplicates']}), {c['expire_directives']} expire"
    )
    raised = ", ".join(f"{k} {v}" for k, v in sorted(c["alerts_raised"].items())) or "none"
    lines.append(f"alerts raised by kind: {raised}")
    verdict = "OK" if report["safety_ok"] else "FAILED"
    lines.append(
        f"safety: {verdict} ({c['violations']} hold violations, {c['order_violations']} order violations, "
        f"{c['basis_unverified']} unverified; {c['basis_checked']} basis positions and {c['holds_checked']} live holds "
        f"checked, {c['excused_late_holds']} late holds excused by an alert)"
    )
    for ex in c["violation_examples"][:10]:
        lines.append(f"  violation: {ex}")
    logged = report.get("spark_log")
    if logged is not None:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(logged["by_logger"].items())) or "none"
        lines.append(f"Spark's log: {logged['warnings']} warnings, {logged['errors']} errors, {logged['traces']} stack "
                     f"traces (by level and logger: {kinds})")
    audit = report.get("audit")
    if audit is not None:
        lines.append(
            f"live audit: {'OK' if not audit['violations'] else 'FAILED'} ({audit['violations']} violations; "
            f"{audit['directives_checked']} directives and {audit['holds_checked']} holds checked beside the job, "
            f"{audit['unverified']} unverified, {audit['excused']} late holds excused)")
    lag, bound = c["max_lag"], c["lag_bound"]
    lag_s = "n/a" if lag is None else f"{lag / 1e6:.1f} s"
    lines.append(
        f"liveness: {'OK' if report['liveness_ok'] else 'FAILED'} (max lag after warm-up {lag_s}, bound {bound / 1e6:.1f} s "
        f"= retention + longest hold {c['longest_hold_ms'] / 1000:.1f} s + lease + directive interval; {c['lag_samples']} samples)"
    )
    lines.append(f"accounting: {'OK' if report['accounting_ok'] else 'FAILED'}")
    if report.get("simulator_exit"):
        lines.append(f"  note: the simulator exited with {report['simulator_exit']} (failed deliveries)")
    for name, label in (("jvm_rss", "JVM RSS"), ("workers_rss", "Python workers RSS"), ("driver_rss", "driver RSS"),
                        ("state_bytes", "state size")):
        f = report["flat"][name]
        g = f["growth_after_warmup"]
        gs = "n/a" if g is None else f"{g * 100:+.0f}%"
        lines.append(
            f"{label}: start {_mb(f['start'])}, end {_mb(f['end'])}, last third vs middle third {gs} "
            f"-> {'flat' if f['flat'] else 'NOT flat'}"
        )
    for note in c["notes"][:5]:
        lines.append(f"  note: {note}")
    return "\n".join(lines)

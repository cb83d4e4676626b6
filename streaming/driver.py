"""The driver loop of ``safepoint run``: create the topics, start Spark and the query, report each
finished micro-batch, and stop cleanly on SIGINT or SIGTERM.

What the job shows of itself (its progress record on the status topic, the HTTP surface in its
process) is the caller's ``surface``, made by ``surface_for(active)`` before the Spark session
starts (so that its port is bound first); ``active()`` says whether the query runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from safepoint.connectors.kafka.topics import LOG_APPEND_TIME, ensure_topics, timestamp_type, topic_specs
from safepoint.core import CORE, CORE_WHY
from safepoint.core.gaps import Gap
from safepoint.errors import SafepointError
from safepoint.settings import Settings

__all__ = ["Surface", "prepare_topics", "run_job"]


def _start(spark: Any, settings: Settings) -> Any:
    """The job's query, started, and what it says once it runs."""
    from safepoint.streaming.job import build_query

    if settings.spark_ui:
        print(f"safepoint run: Spark UI at {spark.sparkContext.uiWebUrl}", flush=True)
    query = build_query(spark, settings)
    print(f"safepoint run: reading {settings.events_topic} and {settings.control_topic} at {settings.bootstrap}, "
          f"checkpoint {settings.checkpoint}", flush=True)
    print(f"safepoint run: the core runs {'compiled' if CORE == 'compiled' else 'as Python'} ({CORE_WHY})", flush=True)
    return query


class Surface(Protocol):
    def batch(self, progress: dict[str, Any], counts: dict[str, int], rows: int) -> None: ...

    def close(self) -> None: ...


def prepare_topics(settings: Settings) -> list[str]:
    """The job's first step: create the contract's topics that do not exist (the events and control
    topics with the broker's record times, ``LogAppendTime``), say which it created, and warn about an
    events or control topic that keeps its producers' record times. Returns the topics created."""
    created = ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), settings.events_partitions))
    if created:
        print(f"created topics: {', '.join(created)}", flush=True)
    for topic in (settings.events_topic, settings.control_topic):
        stamped = timestamp_type(settings.librdkafka(), topic)
        if stamped is not None and stamped != LOG_APPEND_TIME:
            print(f"safepoint run: warning: {topic} keeps its producers' record times ({stamped}), so each "
                  "publisher's own clock dates its events and one wrong clock can move the cluster's leases and TTLs "
                  "or the order of control and node events; "
                  f"set message.timestamp.type={LOG_APPEND_TIME} on the topic (operator guide, Time)", file=sys.stderr,
                  flush=True)
    return created


def run_job(settings: Settings, surface_for: Callable[[Callable[[], bool]], Surface]) -> int:
    """Run the job until a signal or the query's end; 0 on a clean stop, 1 when the query failed."""
    from safepoint.streaming.job import batch_accounting, gaps_in, messages_in
    from safepoint.streaming.session import build_session, kafka_connector_conf, stop_on_signals, stop_session

    if not settings.checkpoint:
        msg = "safepoint run needs --checkpoint DIR (or SAFEPOINT_CHECKPOINT): the job resumes from it"
        raise SafepointError(msg)
    stopping = stop_on_signals()  # at once: SIGTERM while the job starts is a stop, not a kill
    prepare_topics(settings)
    query: Any = None
    surface = surface_for(lambda: bool(query is not None and query.isActive))  # binds its port first
    spark: Any = None
    try:
        spark = build_session(settings.spark_master, settings.shuffle_partitions, ui=settings.spark_ui,
                              extra=kafka_connector_conf() if settings.source_format == "kafka" else None, **settings.jvm())
        stop_on_signals(stopping)  # again: the session put Spark's own SIGINT handler in place of it
        if not stopping.is_set():
            query = _start(spark, settings)
    except Exception:
        if not stopping.is_set():
            raise
        # stopped while it started: the signal reached the JVM too, and what was starting fails with it
    if query is None:
        surface.close()
        if spark is not None:
            try:
                stop_session(spark)
            except Exception:  # noqa: BLE001, S110 - a JVM the signal ended already: nothing left to stop
                pass
        print("safepoint run: stopped (while starting)", flush=True)
        return 0
    last = None
    told = 0
    try:
        while not stopping.is_set() and query.isActive:
            time.sleep(0.5)
            progress = query.lastProgress
            if progress and progress.get("batchId") != last:
                last = progress.get("batchId")
                counts = batch_accounting(progress)
                shown = " ".join(f"{k}={v}" for k, v in counts.items() if v and k != "consumed")
                took = ((progress.get("durationMs") or {}).get("triggerExecution") or 0) / 1000
                n = messages_in(progress)
                print(f"batch {last}: {n} events, {n / took if took else 0:.0f}/s {shown}".rstrip(), flush=True)
                for gap in gaps_in(progress):
                    if gap["id"] > told:
                        told = gap["id"]
                        print(f"safepoint run: events lost (gap {gap['id']}): {Gap.of(gap).what()}; every node whose "
                              "events were there must restate its holds, and the alert events_lost says which (operator "
                              "guide, Lost events)", file=sys.stderr, flush=True)
                surface.batch(progress, counts, n)
        if not query.isActive and query.exception() is not None:
            print(f"safepoint run: the query failed: {query.exception()}", file=sys.stderr)
            return 1
    finally:
        if query.isActive:
            query.stop()
        surface.close()
        stop_session(spark)
    print("safepoint run: stopped", flush=True)
    return 0

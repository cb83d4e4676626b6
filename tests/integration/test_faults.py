"""Faults against the real broker and the real Spark job: the driver killed with SIGKILL mid-batch
and restarted from its checkpoint, Apache Kafka restarted (clean stop and start) under a running
job, a node restarting in the middle of its transactions, a node flooding the input, and a
partition going quiet. Each ends at the safe point replay computes for the same log, with
nothing lost and nothing applied twice.

The harness (the job as a process, the log, ``verify``) is in tests_support.py.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.devtools.apache_kafka import ApacheKafka
from safepoint.devtools.broker import EmbeddedBroker, free_port
from safepoint.jars import KAFKA
from safepoint.settings import Settings
from safepoint.streaming.job import build_query, messages_in

from conftest import require_jars
from kafka_util import read_topic, unique
from tests_support import (
    CATCH_UP_TIMEOUT_S,
    JOB_START_TIMEOUT_S,
    Feeder,
    JobProcess,
    Message,
    Node,
    Pacer,
    _ids,
    batch_end,
    caught_up,
    check_labels,
    cluster_event,
    file_order_safe_ts,
    in_flight,
    job_flags,
    last_positions,
    make_settings,
    node_view,
    report,
    send,
    simulated_log,
    topic_ends,
    verify,
    wait_for,
)

pytestmark = pytest.mark.integration


# -- 1. the driver is killed with SIGKILL mid-batch ---------------------------------------------


def test_driver_kill9_mid_batch_resumes_from_checkpoint(broker: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "kill9", 3, retention=1_000_000, node_lease_ms=3_000, trigger_ms=200,
                             max_offsets_per_trigger=400)
    log, closing = simulated_log(seed=11, duration_ms=20_000)
    ckpt = tmp_path / "ckpt"
    feeder = Feeder(broker.bootstrap, settings.events_topic, log, per_s=150, allowed=int(len(log) * 0.3))
    job = JobProcess(job_flags(settings, ckpt), tmp_path / "job.log")
    restarted: JobProcess | None = None
    try:
        feeder.start()
        pacer = Pacer(ckpt, feeder, step=100, sink_topic=settings.accounting_topic)
        try:
            wait_for(pacer, JOB_START_TIMEOUT_S, "the sink writing a batch, after two commits", job, every_s=0.005)
            victim = in_flight(ckpt)
            job.kill9()
        finally:
            pacer.close()
        victim_end = batch_end(ckpt, victim) if victim is not None else None
        committed_at_kill = _ids(ckpt, "commits")
        feeder.allow(len(log))  # the nodes go on publishing while the job is down
        restarted = JobProcess(job_flags(settings, ckpt), tmp_path / "job.log")
        feeder.finish()
        for last in (False, True):
            ends = topic_ends(broker.bootstrap, settings.events_topic)
            wait_for(lambda e=ends: caught_up(ckpt, e), CATCH_UP_TIMEOUT_S, "the restarted job to catch up", restarted)
            if not last:
                send(broker.bootstrap, settings.events_topic, [closing])
        assert restarted.stop() == 0, restarted.tail()
    finally:
        for j in (job, restarted):
            if j is not None and j.alive():
                j.kill9()

    # The batch in flight at the kill (if one still was: the fall-back kills between batches) was run
    # again by the restarted job, over the same offsets.
    rerun = victim is not None and victim not in committed_at_kill
    if victim is not None:
        assert victim in _ids(ckpt, "commits") and batch_end(ckpt, victim) == victim_end
    v = verify(broker.bootstrap, settings, ckpt)
    if pacer.sink_hit and rerun:  # part of the batch was written before the kill: the re-run wrote it again
        assert v.accounting_repeats > 0
    final = v.directives["c1"][-1]
    assert final["catalog_floor"] == 1, "the last directive is the closing catalog event's"
    assert {n: {"incarnation": b["incarnation"], "seq": b["seq"]} for n, b in final["basis"].items()} == last_positions(log)
    assert final["safe_ts"] == log[-1][2]["mvcc_now"] - settings.retention == file_order_safe_ts(log, settings, "c1")
    check_labels(v.replay.engine.labels, log, extra_applied=1, resent=v.messages - len(log) - 1)
    report("kill9", messages=len(log), batches=len(v.replay.batches), killed_in_batch=victim, rerun=rerun, in_sink=pacer.sink_hit,
           output_repeats=v.output_repeats, accounting_repeats=v.accounting_repeats,
           directives=len(v.directives["c1"]), safe_ts=final["safe_ts"])


# -- 2. the broker restarts (clean stop and start) while the job runs ------------------------------


def test_broker_clean_restart_while_job_runs(tmp_path: Path) -> None:
    """On Apache Kafka: the embedded broker can acknowledge a write in the instant of its clean stop
    and not keep it (its data is memory and a snapshot), which no client can repair; Kafka's clean
    shutdown keeps every acknowledged write."""
    require_jars(KAFKA)
    kafka = ApacheKafka(port=free_port(), data_dir=str(tmp_path / "broker")).start()
    job: JobProcess | None = None
    restarts = 0
    try:
        settings = make_settings(kafka.bootstrap, "bounce", 3, retention=1_000_000, node_lease_ms=3_000,
                                 trigger_ms=200, max_offsets_per_trigger=400)
        log, closing = simulated_log(seed=12, duration_ms=20_000)
        ckpt = tmp_path / "ckpt"
        feeder = Feeder(kafka.bootstrap, settings.events_topic, log, per_s=150, allowed=int(len(log) * 0.3))
        job = JobProcess(job_flags(settings, ckpt), tmp_path / "job.log")
        feeder.start()
        pacer = Pacer(ckpt, feeder, step=100, sink_topic=settings.accounting_topic)
        try:
            wait_for(pacer, JOB_START_TIMEOUT_S, "the sink writing a batch, after two commits", job, every_s=0.005)
        finally:
            pacer.close()
        feeder.allow(len(log))  # the nodes keep publishing into the outage (their client buffers)
        kafka.stop()
        down_at = time.monotonic()
        time.sleep(2.0)
        kafka.start()
        outage_s = time.monotonic() - down_at
        feeder.finish()
        ends = topic_ends(kafka.bootstrap, settings.events_topic)
        assert sum(ends.values()) >= len(log), "the clean restart kept every message"
        for last in (False, True):
            ends = topic_ends(kafka.bootstrap, settings.events_topic)
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            while not caught_up(ckpt, ends):
                if not job.alive():  # the query died: restart it from its checkpoint
                    restarts += 1
                    assert restarts <= 2, job.tail()
                    print(f"[bounce] the job exited with {job.proc.returncode}; restarting it:\n{job.tail(15)}")
                    job = JobProcess(job_flags(settings, ckpt), tmp_path / "job.log")
                assert time.monotonic() < deadline, f"the job did not catch up:\n{job.tail()}"
                time.sleep(0.1)
            if not last:
                send(kafka.bootstrap, settings.events_topic, [closing])
        assert job.stop() == 0, job.tail()
        v = verify(kafka.bootstrap, settings, ckpt)
    finally:
        if job is not None and job.alive():
            job.kill9()
        kafka.cleanup()
    final = v.directives["c1"][-1]
    assert final["catalog_floor"] == 1, "the last directive is the closing catalog event's"
    assert {n: {"incarnation": b["incarnation"], "seq": b["seq"]} for n, b in final["basis"].items()} == last_positions(log)
    assert final["safe_ts"] == log[-1][2]["mvcc_now"] - settings.retention == file_order_safe_ts(log, settings, "c1")
    check_labels(v.replay.engine.labels, log, extra_applied=1, resent=v.messages - len(log) - 1)
    report("bounce", messages=len(log), outage_s=round(outage_s, 1), in_sink=pacer.sink_hit, job_restarts=restarts,
           feeder_rebuilds=feeder.rebuilds, resent=v.messages - len(log) - 1,
           batches=len(v.replay.batches), output_repeats=v.output_repeats, accounting_repeats=v.accounting_repeats,
           directives=len(v.directives["c1"]), safe_ts=final["safe_ts"])
    assert restarts == 0, "the job survived the broker's clean restart through its clients' retries"


# -- 3. a node restarts in the middle of its transactions ----------------------------------------


@dataclass
class RunningQuery:
    """One query of the shared in-process session, drained (``processAllAvailable``) per phase."""

    spark: Any
    settings: Settings
    ckpt: Path
    query: Any = None
    consumed: int = 0

    def __enter__(self) -> RunningQuery:
        self.query = build_query(self.spark, self.settings, str(self.ckpt))
        return self

    def drain(self) -> None:
        self.query.processAllAvailable()

    def __exit__(self, *exc: object) -> None:
        try:
            self.consumed = sum(messages_in(p) for p in self.query.recentProgress)
        finally:
            self.query.stop()


def test_node_restart_mid_transaction(broker: Any, spark: Any, tmp_path: Path) -> None:
    """A node restarts with a reader, an unprepared and a prepared transaction open: the old process's
    reader and unprepared transaction stay held for the grace (a newer incarnation does not prove the
    older one dead), then go; the prepared transaction stays until its decision. A close the old
    process sent before the restart, delivered late, is its last word (applied, no second process)."""
    settings = make_settings(broker.bootstrap, "restart", 2, retention=100, node_lease_ms=10_000,
                             in_doubt_timeout_ms=2_000, trigger_ms=100, incarnation_grace_ms=500)
    n1, n2 = Node("n1", "c1", 0), Node("n2", "c1", 1)
    phases: list[list[Message]] = [
        [cluster_event("c1", "topology", 999, 1, nodes={"n1": [], "n2": []}),
         n1.heartbeat(1_000, 1_000), n2.heartbeat(1_001, 1_000),                       # seq 1: safe 900
         n1.event("reader_open", 1_002, reader_id="r1", read_ts=950, label="report"),  # dies with n1's process
         n1.event("tx_begin", 1_003, tx_id="t1", begin_ts=960),                        # unprepared: dies too
         n1.event("tx_begin", 1_004, tx_id="t2", begin_ts=970, label="2pc"),
         n1.event("tx_prepare", 1_005, tx_id="t2", coordinator="n2", participants=["n1", "n2"]),  # in doubt: kept
         n1.heartbeat(2_000, 2_000), n2.heartbeat(2_001, 2_000)],                      # seq 2: safe 950 (r1)
    ]
    late = n1.event("reader_close", 3_500, reader_id="r1")  # sent by the old process before it died, delivered late
    n1.restart()
    restart_beat = n1.heartbeat(4_000, 3_000)
    phases.append([restart_beat,                             # incarnation 2: r1, t1 kept for the grace, t2 passes on
                   late,                                     # the old process's last word: r1 closes
                   restart_beat,                             # a duplicate delivery: ignored
                   n2.heartbeat(4_001, 3_000)])              # seq 3: safe 960, blocker tx t1@1 (the grace)
    phases.append([n1.heartbeat(4_600, 3_000), n2.heartbeat(4_601, 3_000)])  # seq 4: past the grace: safe 970 (t2)
    phases.append([n1.event("tx_end", 5_000, tx_id="t2", outcome="commit", commit_ts=2_990),  # seq 5: safe 2900
                   n1.heartbeat(5_001, 3_000), n2.heartbeat(5_002, 3_000)])
    log = [m for phase in phases for m in phase]
    seen: list[tuple[int, int, str | None, str | None]] = []
    with RunningQuery(spark, settings, tmp_path / "ckpt") as run:
        for phase in phases:
            send(broker.bootstrap, settings.events_topic, phase)
            run.drain()
            seen = [(d["seq"], d["safe_ts"], d["blocker"]["kind"], d["blocker"]["id"])
                    for d in node_view(read_topic(broker.bootstrap, settings.directives_topic))[0]
                    if d["type"] == "compaction"]
            if phase is phases[1]:
                assert seen[-1] == (3, 960, "tx", "t1@1"), "within the grace the old process's transaction holds"
            if phase is phases[2]:
                assert seen[-1] == (4, 970, "prepared_tx", "t2"), "after the grace only the prepared t2 holds"
    assert run.consumed == len(log)
    v = verify(broker.bootstrap, settings, tmp_path / "ckpt")
    assert seen == [(1, 900, "retention", None), (2, 950, "reader", "r1"), (3, 960, "tx", "t1@1"),
                    (4, 970, "prepared_tx", "t2"), (5, 2_900, "retention", None)]
    assert v.directives["c1"][3]["basis"]["n1"] == {"incarnation": 2, "seq": 2, "local_min": 970}
    assert v.directives["c1"][4]["basis"]["n1"] == {"incarnation": 2, "seq": 3, "local_min": 2_900}
    in_doubt = [(a["state"], a["node"]) for a in v.alerts["c1"] if a["kind"] == "in_doubt_tx"]
    assert in_doubt == [("raised", "n1"), ("cleared", "n1")]
    assert not [a for a in v.alerts["c1"] if a["kind"] == "duplicate_node"], "a late word is no second process"
    labels = v.replay.engine.labels
    assert labels["ignored:duplicate"] == 1 and labels.get("ignored:stale_incarnation", 0) == 0
    assert v.replay.engine.clusters["c1"].safe_ts == 2_900 == file_order_safe_ts(log, settings, "c1")


# -- 4. a node floods --------------------------------------------------------------------------------


def test_flooding_node_does_not_starve_the_others(broker: Any, spark: Any, tmp_path: Path) -> None:
    limit, first, blocks, w0 = 800, 300, 80, 10_000
    settings = make_settings(broker.bootstrap, "flood", 3, retention=50, node_lease_ms=60_000,
                             max_offsets_per_trigger=limit, first_batch_max_offsets=first, trigger_ms=100)
    flooder, n2 = Node("n1", "c1", 0), Node("n2", "c1", 2)
    m1, m2 = Node("m1", "c2", 1), Node("m2", "c2", 2)
    others = (n2, m1, m2)
    start: list[Message] = [cluster_event("c1", "topology", w0 - 100, 1, nodes={"n1": [], "n2": []}),
                            cluster_event("c2", "topology", w0 - 100, 1, partition=1, nodes={"m1": [], "m2": []})]
    start += [n.heartbeat(w0 - 50, w0 - 50) for n in (flooder, *others)]
    # The burst: 8,000 events in 0.8 s of the flooder's clock, blocks of a beat, 49 reader pairs, a beat.
    flood: list[Message] = []
    for blk in range(blocks):
        base = w0 + 10 * blk
        flood.append(flooder.heartbeat(base, base))
        for j in range(49):
            flood.append(flooder.event("reader_open", base + j // 6, reader_id=f"q{blk}-{j}", read_ts=base))
            flood.append(flooder.event("reader_close", base + j // 6, reader_id=f"q{blk}-{j}"))
        flood.append(flooder.heartbeat(base + 9, base + 9))
    flood_end_wall = w0 + 10 * blocks
    send(broker.bootstrap, settings.events_topic, start + flood)
    flood_offsets = len([m for m in start + flood if m[0] == 0])
    ckpt = tmp_path / "ckpt"

    def flood_drained() -> bool:
        commits = _ids(ckpt, "commits")
        return bool(commits) and batch_end(ckpt, commits[-1]).get(0, 0) >= flood_offsets

    rounds: list[Message] = []
    walls: list[int] = []
    stop = threading.Event()

    def publish_rounds() -> None:
        """The other nodes keep beating in real time (every 0.2 s, 20 ms of their clock) until
        the flood has drained."""
        extra = 3
        while not stop.is_set() and extra > 0:
            wall = w0 + 20 * (len(walls) + 1)
            beat = [n.heartbeat(wall, wall) for n in others]
            if wall > flood_end_wall:
                beat.append(flooder.heartbeat(wall, wall))
            send(broker.bootstrap, settings.events_topic, beat)
            rounds.extend(beat)
            walls.append(wall)
            if flood_drained():
                extra -= 1
            time.sleep(0.2)

    publisher = threading.Thread(target=publish_rounds, daemon=True)
    publisher.start()
    try:
        with RunningQuery(spark, settings, ckpt) as run:
            publisher.join(CATCH_UP_TIMEOUT_S)
            assert not publisher.is_alive(), "the flood did not drain"
            wall = max(walls[-1], flood_end_wall) + 100  # a last beat of every node at one time
            last = [n.heartbeat(wall, wall) for n in (flooder, *others)]
            send(broker.bootstrap, settings.events_topic, last)
            run.drain()
    finally:
        stop.set()
    log = start + flood + rounds + last
    assert run.consumed == len(log)
    v = verify(broker.bootstrap, settings, ckpt)
    for cluster in ("c1", "c2"):
        assert v.directives[cluster][-1]["safe_ts"] == wall - settings.retention
        assert v.replay.engine.clusters[cluster].safe_ts == file_order_safe_ts(log, settings, cluster)
    stale = [a for a in v.alerts.get("c1", []) if a["kind"] == "missing_node" and "stale" in a["detail"]]
    assert not stale, "the flooder never looked stale (nodes not yet reported at the start are alerted, not stale)"
    batches = v.replay.batches
    sizes = [sum(b.values()) - sum(a.values()) for a, b in zip([{}, *batches[:-1]], batches, strict=True)]
    assert max(sizes) <= limit, f"max_offsets_per_trigger={limit} caps every batch (batch sizes {sizes})"
    assert sizes[0] == first < max(sizes), f"the run's first batch reads first_batch_max_offsets={first} (sizes {sizes})"
    during = [i for i, b in enumerate(batches) if b.get(0, 0) < flood_offsets]
    assert len(during) >= len(flood) // limit - 1, f"the flood took only {len(during)} batches"
    with_c2 = [i for i in during if v.replay.per_batch[i]["directives"].get("c2")]
    with_c1 = [i for i in during if v.replay.per_batch[i]["directives"].get("c1")]
    assert len(with_c2) >= len(during) // 2, f"c2's directives came in batches {with_c2} of the flood's {during}"
    assert len(with_c1) >= len(during) // 2, f"c1's safe point moved in batches {with_c1} of the flood's {during}"
    report("flood", messages=len(log), batches=len(batches), flood_batches=len(during), c2_directive_batches=len(with_c2),
           c1_directive_batches=len(with_c1), output_repeats=v.output_repeats)


# -- 5. a partition goes quiet ---------------------------------------------------------------------


def test_quiet_partition_raises_missing_node_then_recovers(broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "quiet", 3, retention=100, node_lease_ms=3_000, trigger_ms=100)
    # a and b share partition 0: across two partitions a micro-batch may see b's beats of a phase
    # before a's, and b 3,001 ms past a's last beat makes a stale for a moment (a real, but other,
    # missing_node alert than the one this test is about: CI saw a raised and cleared at 6,001)
    a, b = Node("a", "c1", 0), Node("b", "c1", 0)
    quiet = (Node("c", "c1", 2), Node("d", "c1", 2))  # both on partition 2

    def rounds(walls: range, nodes: tuple[Node, ...]) -> list[Message]:
        return [n.heartbeat(w + i, w) for w in walls for i, n in enumerate(nodes)]

    everyone = (a, b, *quiet)
    phases = [
        [cluster_event("c1", "topology", 999, 1, nodes={"a": [], "b": [], "c": [], "d": []}),
         *rounds(range(1_000, 4_000, 1_000), everyone)],                     # safe 900, 1900, 2900
        rounds(range(4_000, 7_000, 1_000), (a, b)),                          # partition 2 quiet: safe holds
        rounds(range(7_000, 10_000, 1_000), (a, b)),                         # past the lease: c, d missing
        rounds(range(10_000, 12_000, 1_000), everyone),                      # back: cleared, 9900, 10900
    ]
    ckpt = tmp_path / "ckpt"
    after: list[list[dict[str, Any]]] = []
    with RunningQuery(spark, settings, ckpt) as run:
        for phase in phases:
            send(broker.bootstrap, settings.events_topic, phase)
            run.drain()
            after.append([d for d in node_view(read_topic(broker.bootstrap, settings.directives_topic))[0]
                          if d["type"] == "compaction"])
    log = [m for phase in phases for m in phase]
    assert run.consumed == len(log)
    v = verify(broker.bootstrap, settings, ckpt)
    safe = [[d["safe_ts"] for d in phase] for phase in after]
    assert safe[0] == [900, 1_900, 2_900]
    assert safe[1] == safe[2] == safe[0], "the safe point holds while partition 2 is quiet"
    assert safe[3] == [900, 1_900, 2_900, 9_900, 10_900]
    missing = [(x["state"], x["node"], x["cluster_wall_ms"]) for x in v.alerts["c1"] if x["kind"] == "missing_node"]
    # at the start every node the topology names is missing until its first beat (alerted at once)
    assert missing[:6] == [("raised", "b", 1_000), ("raised", "c", 1_000), ("raised", "d", 1_000),
                           ("cleared", "b", 1_001), ("cleared", "c", 1_002), ("cleared", "d", 1_003)]
    assert missing[6:] == [("raised", "c", 7_000), ("raised", "d", 7_000), ("cleared", "c", 10_002), ("cleared", "d", 10_003)]
    # The source read nothing from partition 2 for several batches while the others moved on.
    p2 = [end.get(2, 0) for end in v.replay.batches]
    quiet_batches = [i for i in range(1, len(p2)) if p2[i] == p2[i - 1]]
    assert len(quiet_batches) >= 2, v.replay.batches
    assert v.replay.engine.clusters["c1"].safe_ts == 10_900 == file_order_safe_ts(log, settings, "c1")


# -- the sink's producer after a broker crash ------------------------------------------------------


def test_sink_rebuilds_its_producer_after_a_fatal_error(tmp_path: Path, caplog: Any) -> None:
    """Not a fault the job promises to survive (the embedded broker is not crash-safe), but the one
    that kills an idempotent producer: a broker that lost acknowledged messages answers the next
    produce with OUT_OF_ORDER_SEQUENCE_NUMBER. The sink's task (and the job's operator, which sends
    through the same ``Outbox``) drops the dead producer and sends its rows again on a new one,
    instead of failing the batch (and with it the local query)."""
    from safepoint.streaming.kafka_sink import KafkaStreamWriter

    kafka = EmbeddedBroker(port=free_port(), data_dir=str(tmp_path / "broker")).start()
    try:
        topic = unique("sink")
        ensure_topics({"bootstrap.servers": kafka.bootstrap}, topic_specs(
            {"events": f"{topic}.e", "directives": topic, "alerts": f"{topic}.a", "deadletter": f"{topic}.d"}, 1))
        writer = KafkaStreamWriter({"bootstrap.servers": kafka.bootstrap, "kafka.log_level": "0"})
        rows = [{"topic": topic, "key": "c1", "value": json.dumps({"seq": i})} for i in range(200)]
        assert writer.write(iter(rows[:100])).count == 100  # type: ignore[attr-defined]
        kafka.kill()  # loses what it acknowledged in the last second: the producer's sequence breaks
        kafka.start()
        with caplog.at_level("WARNING", logger="safepoint.streaming.kafka_sink"):
            assert writer.write(iter(rows[100:])).count == 100  # type: ignore[attr-defined]
        assert "failed fatally" in caplog.text, "the broker kept the first rows: no fatal error to recover from"
        got = [m["seq"] for m in read_topic(kafka.bootstrap, topic)]
        assert got[-100:] == list(range(100, 200)), "the second task's rows, all of them, in order"
    finally:
        kafka.cleanup()

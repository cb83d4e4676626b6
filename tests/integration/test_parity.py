"""Issue 3's cross-check: one generated log through the Spark job (real broker, real session,
restarted in the middle) and through replay; the outputs must be identical."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import TIMESTAMP_LOG_APPEND_TIME, ensure_topics, topic_specs
from safepoint.core import Engine, Output, Policy, Position
from safepoint.core.batch import BY_NAME, merge_log_order
from safepoint.core.codec import encode
from safepoint.devtools.simulate import SimConfig, generate_log, key_of
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query, messages_in

from kafka_util import produce, read_topic, topic_flags, unique
from tests_support import replay_policies

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


def drained(log: list[dict[str, Any]], rng: random.Random) -> list[Any]:
    """The log with duplicates, bad messages, cluster events, then every hold closed and a
    final heartbeat per node (so the safe point must reach min(mvcc_now - retention))."""
    out: list[Any] = []
    open_: dict[str, dict[str, str]] = {}
    state: dict[str, tuple[int, int]] = {}
    last_wall = 0
    for ev in log:
        out.append(ev)
        last_wall = ev["wall_ms"]
        node = ev.get("node")
        if node:
            if state.get(node, (-1, -1))[0] != ev["incarnation"]:
                open_[node] = {k: v for k, v in open_.get(node, {}).items() if v == "prepared"}
            state[node] = (ev["incarnation"], ev["seq"])
            holds = open_.setdefault(node, {})
            if ev["type"] == "reader_open":
                holds[ev["reader_id"]] = "reader"
            elif ev["type"] == "tx_begin":
                holds[ev["tx_id"]] = "tx"
            elif ev["type"] == "tx_prepare" and ev["tx_id"] in holds:
                holds[ev["tx_id"]] = "prepared"
            elif ev["type"] in ("reader_close", "tx_end"):
                holds.pop(ev.get("reader_id") or ev.get("tx_id"), None)
        if rng.random() < 0.01:
            out.append(dict(ev))  # a duplicate delivery
        if rng.random() < 0.003:
            out.append(rng.choice([b"\xff\xfe", "{not json", "[]", json.dumps({"v": 2, "type": "heartbeat"})]))
    mvcc = (last_wall + 5_000) * 1000
    wall = last_wall + 1
    out.append({"v": 1, "type": "catalog", "cluster": "default", "wall_ms": wall, "version": 10,
                "catalog_version": 3, "activated_at": mvcc - 10})
    for node, (inc, seq) in sorted(state.items()):
        for hid, kind in sorted(open_.get(node, {}).items()):
            seq += 1
            wall += 1
            base = {"v": 1, "cluster": "default", "node": node, "incarnation": inc, "seq": seq, "wall_ms": wall}
            if kind == "reader":
                out.append({**base, "type": "reader_close", "reader_id": hid})
            else:
                out.append({**base, "type": "tx_end", "tx_id": hid, "outcome": "commit"})
        state[node] = (inc, seq)
    # Two rounds of heartbeats a second apart (a directive interval may hold the first advance
    # until the next event), republishing each group's min tx time.
    for round_ in (1, 2):
        # the second round after the grace: the holds of a process that restarted last have gone by then
        wall += (1_000 + Policy().incarnation_grace_ms) * (round_ - 1)
        for node, (inc, seq) in sorted(state.items()):
            wall += 1
            out.append({"v": 1, "type": "heartbeat", "cluster": "default", "node": node, "incarnation": inc,
                        "seq": seq + round_, "wall_ms": wall, "mvcc_now": mvcc,
                        "groups": [{"group": f"g{node}-0", "leader": True, "published_min_tx_time": mvcc}]})
    return out


def as_message(ev: Any) -> tuple[str | None, Any]:
    if isinstance(ev, dict) and ("node" in ev or "cluster" in ev):
        return key_of(ev), json.dumps(ev)
    return "junk", ev


def test_generated_log_job_equals_replay_across_a_restart(broker: Any, spark: Any, tmp_path: Any) -> None:
    tag = unique("parity")
    settings = load_settings(flags={"bootstrap": broker.bootstrap, **topic_flags(tag), "retention": 1_000_000,
                                    "node_lease_ms": 3_000, "directive_interval_ms": 200}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 3, log_append_time=False))
    cfg = SimConfig(nodes=6, rate=300, long_reader_share=0.01, long_reader_ms=(1_000, 6_000),
                    restart_per_node_per_min=3.0, groups_per_node=1)
    log = drained(generate_log(cfg, 20_000, seed=7), random.Random(7))
    half = len(log) // 2
    ckpt = str(tmp_path / "ckpt")
    phases = [log[:half], log[half:]]
    engine: Engine | None = None  # given the job's generation once its first start made one
    expected: dict[str, list[str]] = {"directives": [], "alerts": [], "deadletter": []}
    consumed = 0
    for phase in phases:
        before = {p: n for p, n in _ends(broker.bootstrap, settings.events_topic).items()}
        produce(broker.bootstrap, settings.events_topic, [as_message(e) for e in phase])
        q = build_query(spark, settings, ckpt)
        try:
            q.processAllAvailable()
            consumed += sum(messages_in(p) for p in q.recentProgress)
        finally:
            q.stop()
        engine = engine or Engine(replay_policies(settings, ckpt))
        for o in replay_batch(engine, broker.bootstrap, settings.events_topic, before):
            expected[o.channel].append(encode(o.value))
    assert consumed == len(log), "every message consumed exactly once across the restart"

    got = {ch: unkeyed(broker.bootstrap, t)
           for ch, t in (("directives", settings.directives_topic), ("alerts", settings.alerts_topic),
                         ("deadletter", settings.deadletter_topic))}
    assert len(expected["directives"]) > 10
    assert got["directives"] == expected["directives"]
    assert got["alerts"] == expected["alerts"]
    def no_key(items: list[str]) -> list[str]:
        return sorted(encode({k: v for k, v in json.loads(i).items() if k != "key"}) for i in items)

    assert no_key(got["deadletter"]) == no_key(expected["deadletter"])
    assert len(got["deadletter"]) == sum(1 for e in log if not isinstance(e, dict) or e.get("v") != 1)

    # Liveness: after the drain the safe point is min(mvcc_now - retention), in file order too.
    final = json.loads(got["directives"][-1])["safe_ts"]
    assert final == log[-1]["mvcc_now"] - settings.retention
    file_engine = Engine(settings.policy())
    for i, e in enumerate(log):
        file_engine.process(as_message(e)[1], Position("file", 0, i))
    assert file_engine.clusters["default"].safe_ts == final


def test_a_failed_delivery_fails_the_batch_and_its_rerun_loses_nothing(broker: Any, spark: Any, tmp_path: Any) -> None:
    """The operator produces its own outputs when its task ends, before Spark commits the state. A
    delivery that fails (here: the status topic's name is one the broker refuses) must fail the
    batch with nothing committed; run again, the batch sends everything: what the failed run had
    delivered repeats a part of what replay emits, and the rerun's outputs are all of it."""
    from dataclasses import replace

    from pyspark.errors import StreamingQueryException

    tag = unique("redo")
    settings = load_settings(flags={"bootstrap": broker.bootstrap, **topic_flags(tag, "status"), "retention": 1_000_000,
                                    "node_lease_ms": 3_000, "directive_interval_ms": 200}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2, log_append_time=False))
    log = drained(generate_log(SimConfig(nodes=4, rate=200), 8_000, seed=11), random.Random(11))
    half = len(log) // 2
    ckpt = tmp_path / "ckpt"

    def run(phase_settings: Any) -> None:
        q = build_query(spark, phase_settings, str(ckpt))
        try:
            q.processAllAvailable()
        finally:
            q.stop()

    def directives() -> list[str]:
        return unkeyed(broker.bootstrap, settings.directives_topic)

    produce(broker.bootstrap, settings.events_topic, [as_message(e) for e in log[:half]])
    run(settings)
    first = directives()
    produce(broker.bootstrap, settings.events_topic, [as_message(e) for e in log[half:]])
    with pytest.raises(StreamingQueryException, match="(Invalid|Unknown) topic"):
        run(replace(settings, status_topic="refused/status"))
    assert sorted(p.name for p in (ckpt / "commits").iterdir() if p.name.isdigit()) == ["0"], \
        "the failed batch was committed"
    failed = directives()[len(first):]
    run(settings)

    expected = [encode(o.value) for o in replay_batch(Engine(replay_policies(settings, ckpt)), broker.bootstrap, settings.events_topic, {})
                if o.channel == "directives"]
    got = directives()
    n = len(first)
    assert got[:n] == expected[:n], "the first batch, as replay"
    assert failed == expected[n:n + len(failed)], "what the failed run delivered (if any) is the batch's start, in order"
    assert got[n + len(failed):] == expected[n:], "the rerun sent all of the batch's directives"


def replay_batch(engine: Engine, bootstrap: str, topic: str, since: dict[int, int], control: str | None = None
                 ) -> list[Output]:
    """What ``engine`` emits over the topic's messages after ``since`` (and all of the ``control``
    topic's, which ``engine``'s origins must name) taken as one micro-batch, in the job's order: per
    partition by offset, merged by log time (the broker's, else wall_ms)."""
    from safepoint.core.origin import control_partition, is_control, kafka_partition

    rows = _rows_since(bootstrap, topic, since)
    if control is not None:
        rows += [{**r, "partition": control_partition(r["partition"])} for r in _rows_since(bootstrap, control, {})]
    out: list[Output] = []
    for r in merge_log_order(rows, *BY_NAME):
        p = r["partition"]
        pos = Position(control if is_control(p) and control else topic, kafka_partition(p), r["offset"], r["key"])
        out += engine.process(r["value"], pos, r["broker"])
    return out


def unkeyed(bootstrap: str, topic: str) -> list[str]:
    """The topic's values, encoded as the core encodes them, without the reader's ``key`` field."""
    return [encode({k: v for k, v in m.items() if k != "key"}) for m in read_topic(bootstrap, topic)]


def _ends(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("w")})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def _rows_since(bootstrap: str, topic: str, start: dict[int, int]) -> list[dict[str, Any]]:
    import time

    from confluent_kafka import Consumer, TopicPartition

    ends = _ends(bootstrap, topic)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("rows"), "enable.auto.commit": False})
    rows: list[dict[str, Any]] = []
    try:
        for p, end in sorted(ends.items()):
            pos = start.get(p, 0)
            if pos >= end:
                continue
            c.assign([TopicPartition(topic, p, pos)])
            deadline = time.monotonic() + 20
            while pos < end and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None or m.error():
                    continue
                v = m.value()
                kind, stamp = m.timestamp()
                broker = stamp if kind == TIMESTAMP_LOG_APPEND_TIME else None
                wall = -1
                try:
                    obj = json.loads(v)
                    if isinstance(obj, dict) and isinstance(obj.get("wall_ms"), int):
                        wall = obj["wall_ms"]
                except ValueError:
                    pass
                log = -1 if wall == -1 else (wall if broker is None else broker)
                rows.append({"partition": p, "offset": m.offset(), "key": m.key(), "value": v, "log_ms": log,
                             "broker": broker})
                pos = m.offset() + 1
        return rows
    finally:
        c.close()

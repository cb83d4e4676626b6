"""The node client library (Reporter, DirectiveListener) against the real embedded broker."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from safepoint.connectors.kafka.clients import CLIENTS
from safepoint.connectors.kafka.topics import ensure_topics
from safepoint.connectors.listener import Directive, DirectiveListener, ExpireDirective, compact_up_to
from safepoint.connectors.reporter import Handle, Reader, Reporter, default_incarnation
from safepoint.devtools.broker import EmbeddedBroker
from safepoint.errors import AdmissionRefused, ClientClosed, ReaderExpired, ReaderRefused
from safepoint.schemas import load
from safepoint.settings import Settings

from doc_blocks import block

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)

WALL0 = 1_700_000_000_000


# -- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture(autouse=True, params=CLIENTS)
def client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test of the node client runs on both Kafka libraries: the reporters and listeners
    a test makes without naming one use this test's (``client=`` is an ordinary keyword)."""
    name: str = request.param
    monkeypatch.setitem(Reporter.__init__.__kwdefaults__, "client", name)
    monkeypatch.setitem(DirectiveListener.__init__.__kwdefaults__, "client", name)
    return name


@pytest.fixture(scope="module")
def kafka() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:
        yield broker


def _name(prefix: str) -> str:
    return f"test.{prefix}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def events_topic(kafka: EmbeddedBroker) -> str:
    topic = _name("events")
    ensure_topics(
        {"bootstrap.servers": kafka.bootstrap},
        [NewTopic(topic, num_partitions=2, replication_factor=1, config={"cleanup.policy": "delete"})],
    )
    return topic


@pytest.fixture
def directives_topic(kafka: EmbeddedBroker) -> str:
    topic = _name("directives")
    ensure_topics(
        {"bootstrap.servers": kafka.bootstrap},
        [NewTopic(topic, num_partitions=1, replication_factor=1, config={"cleanup.policy": "compact"})],
    )
    return topic


class Clock:
    """An injected wall clock: every call advances it by ``step`` ms."""

    def __init__(self, start: int = WALL0, step: int = 1) -> None:
        self.now = start
        self.step = step
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            self.now += self.step
            return self.now


def make_reporter(kafka: EmbeddedBroker, topic: str, **kwargs: Any) -> Reporter:
    kwargs.setdefault("cluster", "c1")
    kwargs.setdefault("incarnation", 7)
    kwargs.setdefault("heartbeat_interval_s", None)
    kwargs.setdefault("mvcc_clock", lambda: 1_000)
    kwargs.setdefault("wall_clock", Clock())
    return Reporter(kafka.bootstrap, kwargs.pop("node", "n1"), topic=topic, **kwargs)


def consume(
    bootstrap: str,
    topic: str,
    until: Callable[[list[tuple[bytes | None, bytes]]], bool],
    timeout_s: float = 10.0,
) -> list[tuple[bytes | None, bytes]]:
    """(key, value) of every message from the beginning, in offset order per partition, until ``until`` holds."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _name("reader"),
            "enable.auto.commit": False,
            "receive.message.max.bytes": 1_000_000_000,
        }
    )
    out: list[tuple[bytes | None, bytes]] = []
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        deadline = time.monotonic() + timeout_s
        while not until(out):
            assert time.monotonic() < deadline, f"timed out; got {len(out)} message(s): {out[-5:]}"
            m = c.poll(0.1)
            if m is None or m.error() is not None:
                continue
            value = m.value()
            assert value is not None
            out.append((m.key(), value))
        return out
    finally:
        c.close()


def consume_events(bootstrap: str, topic: str, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Exactly the first ``n`` events (a short grace read proves there are no more)."""
    msgs = consume(bootstrap, topic, lambda out: len(out) >= n, timeout_s)
    assert len(msgs) == n == _count(bootstrap, topic), "unexpected extra events"
    return [decode_valid(k, v) for k, v in msgs]


def _count(bootstrap: str, topic: str) -> int:
    """Messages in the topic, from the high watermarks."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": _name("count"), "enable.auto.commit": False})
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
    finally:
        c.close()


def decode_valid(key: bytes | None, value: bytes) -> dict[str, Any]:
    """Parse a message value and validate it against the contract's schema of its type."""
    text = value.decode("utf-8")
    event: dict[str, Any] = json.loads(text)
    assert text == json.dumps(event, separators=(",", ":"), ensure_ascii=False), "value is not compact JSON"
    jsonschema.Draft7Validator(load("events", "_envelope")).validate(event)
    jsonschema.Draft7Validator(load("events", event["type"])).validate(event)
    assert key == event["node"].encode(), "node events are keyed by node id"
    return event


def produce(bootstrap: str, topic: str, messages: list[tuple[str, dict[str, Any]]]) -> None:
    # One request in flight keeps the order; an idempotent producer would spend 0.5 s starting up.
    p = Producer({"bootstrap.servers": bootstrap, "max.in.flight.requests.per.connection": 1, "linger.ms": 0})
    for key, value in messages:
        p.produce(topic, key=key.encode(), value=json.dumps(value, separators=(",", ":")).encode())
        p.poll(0)
    assert p.flush(10) == 0


def directive(seq: int, safe_ts: int, cluster: str = "c1", catalog_floor: int | None = 3) -> dict[str, Any]:
    value = {
        "v": 1,
        "type": "compaction",
        "cluster": cluster,
        "seq": seq,
        "safe_ts": safe_ts,
        "catalog_floor": catalog_floor,
        "cluster_wall_ms": WALL0 + seq,
        "blocker": {"node": "n3", "kind": "reader", "id": "r-9", "ts": safe_ts, "age_ms": 10, "label": None},
        "basis": {"n1": {"incarnation": 2, "seq": 18, "local_min": safe_ts}},
    }
    jsonschema.Draft7Validator(load("outputs", "compaction")).validate(value)
    return value


def expire(
    seq: int,
    node: str,
    hold_id: str,
    cluster: str = "c1",
    *,
    mode: str = "graceful",
    kind: str = "reader",
    cluster_wall_ms: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """An expire directive (key, value) as the job writes it; ``kind`` "reader" or "tx"."""
    value: dict[str, Any] = {
        "v": 1,
        "type": "expire",
        "cluster": cluster,
        "node": node,
        ("reader_id" if kind == "reader" else "tx_id"): hold_id,
        "reason": "pinned_bytes critical",
        "mode": mode,
        "seq": seq,
    }
    if cluster_wall_ms is not None:
        value["cluster_wall_ms"] = cluster_wall_ms
    jsonschema.Draft7Validator(load("outputs", "expire")).validate(value)
    return f"{cluster}/{node}/{hold_id}", value


def poll_until(listener: DirectiveListener, pred: Callable[[Directive], bool], timeout_s: float = 10.0) -> Directive:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        d = listener.poll(0.2)
        if d is not None and pred(d):
            return d
    raise AssertionError("no matching directive before the deadline")


def wait_for(pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.02)


# -- Reporter ------------------------------------------------------------------------------


def test_reader_and_transaction_publish_expected_events_in_order(kafka: EmbeddedBroker, events_topic: str) -> None:
    with make_reporter(kafka, events_topic, wall_clock=Clock(step=0)) as rep:
        with rep.reader(100, label="report", groups=["g1"], namespace="db1", reader_id="r-1") as r:
            assert r.is_open and [x.reader_id for x in rep.active_readers] == ["r-1"]
        with rep.transaction(120, label="etl") as tx:
            tx.prepare("n2", ["n1", "n2"])
            tx.end("commit", commit_ts=130)
        with rep.transaction(140, tx_id="t-2"):
            pass
        assert rep.active_readers == [] and rep.active_transactions == []
        assert rep.flush(10) == 0
        assert rep.stats().delivered == 7

    events = consume_events(kafka.bootstrap, events_topic, 7)
    assert [e["type"] for e in events] == [
        "reader_open",
        "reader_close",
        "tx_begin",
        "tx_prepare",
        "tx_end",
        "tx_begin",
        "tx_end",
    ]
    assert [e["seq"] for e in events] == list(range(7))
    assert all(e["incarnation"] == 7 and e["node"] == "n1" and e["cluster"] == "c1" for e in events)
    assert events[2]["tx_id"] == events[3]["tx_id"] == events[4]["tx_id"] == tx.tx_id
    assert tx.tx_id.startswith("t-") and len(tx.tx_id) == 14
    assert events[3]["participants"] == ["n1", "n2"] and events[3]["coordinator"] == "n2"
    assert events[4]["outcome"] == "commit" and events[4]["commit_ts"] == 130
    assert events[6] == {**events[6], "tx_id": "t-2", "outcome": "commit"} and "commit_ts" not in events[6]
    # The exact bytes on the wire: field order, compact separators, optional fields only when set.
    msgs = consume(kafka.bootstrap, events_topic, lambda out: len(out) >= 2)
    assert msgs[0] == (
        b"n1",
        (
            b'{"v":1,"type":"reader_open","cluster":"c1","wall_ms":1700000000000,"node":"n1","incarnation":7,'
            b'"seq":0,"reader_id":"r-1","read_ts":100,"groups":["g1"],"namespace":"db1","label":"report"}'
        ),
    )
    assert msgs[1][1] == (
        b'{"v":1,"type":"reader_close","cluster":"c1","wall_ms":1700000000000,"node":"n1",'
        b'"incarnation":7,"seq":1,"reader_id":"r-1"}'
    )


def test_exception_in_context_still_closes_and_aborts(kafka: EmbeddedBroker, events_topic: str) -> None:
    with make_reporter(kafka, events_topic) as rep:
        with pytest.raises(RuntimeError, match="boom"), rep.reader(100) as r:
            raise RuntimeError("boom")
        with pytest.raises(RuntimeError, match="boom"), rep.transaction(110) as tx:
            raise RuntimeError("boom")
        # A prepared transaction left by an exception is in doubt: it stays held until decided.
        with pytest.raises(RuntimeError, match="boom"), rep.transaction(120) as prepared:
            prepared.prepare("n2", ["n1", "n2"])
            raise RuntimeError("boom")
        assert rep.active_transactions == [prepared]
        rep.snapshot()
        prepared.end("abort")
        assert rep.active_transactions == []

    events = consume_events(kafka.bootstrap, events_topic, 8)
    assert [(e["type"], e["seq"]) for e in events] == [
        ("reader_open", 0),
        ("reader_close", 1),
        ("tx_begin", 2),
        ("tx_end", 3),
        ("tx_begin", 4),
        ("tx_prepare", 5),
        ("snapshot", 6),
        ("tx_end", 7),
    ]
    assert events[1]["reader_id"] == r.reader_id
    assert events[3] == {**events[3], "tx_id": tx.tx_id, "outcome": "abort"}
    snap = events[6]
    assert snap["readers"] == [] and snap["cut"] == 1_000
    assert snap["txs"] == [
        {
            "tx_id": prepared.tx_id,
            "begin_ts": 120,
            "opened_wall_ms": events[4]["wall_ms"],
            "prepared": True,
            "coordinator": "n2",
            "participants": ["n1", "n2"],
        }
    ]
    assert events[7] == {**events[7], "tx_id": prepared.tx_id, "outcome": "abort"}


def test_reader_refused_below_safe_ts_publishes_nothing(kafka: EmbeddedBroker, events_topic: str) -> None:
    with make_reporter(kafka, events_topic) as rep:
        rep.observe_safe_ts(500)
        rep.observe_safe_ts(400)  # the safe point never goes backwards
        assert rep.safe_ts == 500
        with pytest.raises(ReaderRefused, match=r"below the cluster's safe point.* 500.*>= 500"):
            rep.reader(499).open()
        with pytest.raises(ReaderRefused, match="safe point 500"), rep.transaction(10):
            pytest.fail("the body must not run")
        assert rep.seq == 0 and rep.active_readers == [] and rep.active_transactions == []
        with rep.reader(500):  # the bound is inclusive
            pass
    events = consume_events(kafka.bootstrap, events_topic, 2)
    assert [(e["type"], e["read_ts"] if "read_ts" in e else None) for e in events] == [
        ("reader_open", 500),
        ("reader_close", None),
    ]


def test_reader_without_ts_reads_at_mvcc_clock_and_closed_reporter_refuses(kafka: EmbeddedBroker, events_topic: str) -> None:
    rep = make_reporter(kafka, events_topic, mvcc_clock=lambda: 4_242)
    with rep.reader() as r:
        assert r.read_ts == 4_242
    rep.close()
    rep.close()  # idempotent
    with pytest.raises(ClientClosed):
        rep.reader(5_000).open()
    events = consume_events(kafka.bootstrap, events_topic, 2)
    assert events[0]["read_ts"] == 4_242


def test_heartbeat_thread_publishes_with_injected_clocks(kafka: EmbeddedBroker, events_topic: str) -> None:
    mvcc = iter(range(10_000, 10_000_000, 10))
    figures = {"pinned_bytes": 123, "debt_bytes": 4, "groups": [{"group": "g1", "leader": True, "published_min_tx_time": None}],
               "history_above": [(9_000, 100), {"ts": 9_500, "bytes": 40}]}
    rep = make_reporter(
        kafka,
        events_topic,
        heartbeat_interval_s=0.05,
        wall_clock=Clock(step=1000),
        mvcc_clock=lambda: next(mvcc),
        figures=lambda: figures,
    )
    try:
        with rep.reader(9_000, reader_id="r-hb"):
            wait_for(lambda: rep.stats().sent >= 4)
            msgs = consume(kafka.bootstrap, events_topic, lambda out: len(out) >= 4)
    finally:
        rep.close()
    events = [decode_valid(k, v) for k, v in msgs]
    beats = [e for e in events if e["type"] == "heartbeat"]
    assert len(beats) >= 2
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    walls = [e["wall_ms"] for e in beats]
    assert all(w > WALL0 and (w - WALL0) % 1000 == 0 for w in walls) and walls == sorted(walls)
    mvccs = [e["mvcc_now"] for e in beats]
    assert mvccs == sorted(mvccs) and all(m >= 10_000 for m in mvccs)
    assert beats[-1]["pinned_bytes"] == 123 and beats[-1]["debt_bytes"] == 4
    assert beats[-1]["groups"] == figures["groups"]
    assert beats[-1]["history_above"] == [{"ts": 9_000, "bytes": 100}, {"ts": 9_500, "bytes": 40}]
    assert beats[-1]["active_readers"] == 1 and beats[-1]["active_txs"] == 0
    assert not rep.stats().delivery_failures


def test_seq_strictly_increasing_across_threads(kafka: EmbeddedBroker, events_topic: str) -> None:
    n_threads, per_thread = 8, 25
    with make_reporter(kafka, events_topic) as rep:

        def work() -> None:
            for _ in range(per_thread):
                with rep.reader(1_000):
                    pass

        threads = [threading.Thread(target=work) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    total = n_threads * per_thread * 2
    events = consume_events(kafka.bootstrap, events_topic, total)
    assert [e["seq"] for e in events] == list(range(total))  # one partition (one key): offset order == seq order
    open_ids: set[str] = set()
    for e in events:
        if e["type"] == "reader_open":
            assert e["reader_id"] not in open_ids
            open_ids.add(e["reader_id"])
        else:
            open_ids.remove(e["reader_id"])
    assert not open_ids


def test_incarnation_grows_at_each_start(tmp_path: Path) -> None:
    frozen = Clock(step=0)
    first = default_incarnation("n1", "c1", tmp_path, frozen)
    second = default_incarnation("n1", "c1", tmp_path, frozen)
    assert second > first >= WALL0
    (tmp_path / "c1.n1.incarnation").write_text("garbage")  # a corrupt file falls back to the clock
    assert default_incarnation("n1", "c1", tmp_path, Clock(start=WALL0 + 10**6, step=0)) > second
    back = default_incarnation("n1", "c1", tmp_path, Clock(start=5, step=0))  # the clock stepped back
    assert back > second
    # Without a state dir: the clock, yet never twice the same number in one process.
    a = default_incarnation("n9", "c1", None, frozen)
    assert default_incarnation("n9", "c1", None, frozen) == a + 1


def test_reporter_recovers_after_broker_crash(client: str) -> None:
    """After kill -9 the idempotent producer fails (OUT_OF_ORDER_SEQUENCE_NUMBER): librdkafka's
    fatally, and the reporter recreates it; kafka-python bumps its epoch by itself and the lost
    events come back as delivery failures. Either way the reporter republishes its active set as
    a snapshot."""
    broker = EmbeddedBroker().start()
    data_dir = broker.data_dir  # the restarted broker reuses it, so its cleanup() would leave it behind
    topic = _name("crash")
    try:
        ensure_topics({"bootstrap.servers": broker.bootstrap}, [NewTopic(topic, num_partitions=1, replication_factor=1)])
        rep = make_reporter(broker, topic)
        reader = rep.reader(100, reader_id="r-survivor").open()
        assert rep.flush(10) == 0
        for _ in range(30):  # in flight when the broker dies
            rep.heartbeat()
        broker.kill()
        broker = EmbeddedBroker(port=broker.port, data_dir=broker.data_dir).start()
        deadline = time.monotonic() + 20
        recovered = (lambda: rep.stats().producer_restarts > 0) if client == "confluent" else (
            lambda: rep.stats().delivery_failures > 0)
        while time.monotonic() < deadline and not recovered():
            rep.heartbeat()
            rep.flush(0.5)
        assert recovered(), rep.stats()
        rep.heartbeat()  # publishes the repair snapshot first
        assert rep.flush(10) == 0
        msgs = consume(broker.bootstrap, topic, lambda out: any(b'"type":"snapshot"' in v for _, v in out))
        snap = next(decode_valid(k, v) for k, v in msgs if b'"type":"snapshot"' in v)
        assert [r["reader_id"] for r in snap["readers"]] == ["r-survivor"]
        assert rep.stats().repair_snapshots >= 1
        reader.close()
        rep.close()
    finally:
        broker.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)


# -- DirectiveListener ---------------------------------------------------------------------


def test_listener_ignores_repeats_and_other_clusters(kafka: EmbeddedBroker, directives_topic: str) -> None:
    with (
        make_reporter(kafka, _name("unused-events")) as rep,
        DirectiveListener(kafka.bootstrap, topic=directives_topic, reporter=rep) as listener,
    ):
        assert listener.cluster == "c1" and listener.node == "n1"
        wait_for(lambda: listener.poll(0.1) is None and listener.caught_up)  # empty topic: nothing to deliver
        produce(
            kafka.bootstrap,
            directives_topic,
            [
                ("c1", directive(1, 100)),
                ("c2", directive(5, 900, cluster="c2")),
                ("c1", directive(2, 200, catalog_floor=4)),
                ("c1", directive(2, 200, catalog_floor=4)),  # the at-least-once sink repeats itself
                ("c1", directive(1, 100)),  # older
                ("c1", directive(3, 300, catalog_floor=None)),
            ],
        )
        got = [poll_until(listener, lambda d: True) for _ in range(3)]
        assert [(d.seq, d.safe_ts, d.catalog_floor) for d in got] == [(1, 100, 3), (2, 200, 4), (3, 300, None)]
        assert listener.poll(0.5) is None
        assert listener.safe_ts == 300 and listener.catalog_floor is None and listener.seq == 3
        stats = listener.stats()
        assert (stats.delivered, stats.repeats, stats.other_clusters) == (3, 2, 1)
        # The node-side half of horizon_violation: the reporter learnt the safe point.
        assert rep.safe_ts == 300
        with pytest.raises(ReaderRefused):
            rep.reader(299).open()
    assert compact_up_to(got[-1], None) == 300
    assert compact_up_to(got[-1], 250) == 250
    assert compact_up_to(got[-1], 400) == 300
    assert compact_up_to({"safe_ts": 7}, 9) == 7


def test_listener_delivers_latest_on_start(kafka: EmbeddedBroker, directives_topic: str) -> None:
    produce(
        kafka.bootstrap,
        directives_topic,
        [
            ("c1", directive(1, 100)),
            ("c1", directive(2, 200)),
            ("c2", directive(9, 999, cluster="c2")),
            ("c1", directive(3, 300, catalog_floor=5)),
            ("c1", directive(3, 300, catalog_floor=5)),
            ("c1", {"v": 1, "type": "compaction", "cluster": "c1", "seq": 4}),  # invalid: skipped, logged
        ],
    )
    with DirectiveListener(kafka.bootstrap, "c1", topic=directives_topic) as listener:
        first = poll_until(listener, lambda d: True)
        assert (first.seq, first.safe_ts, first.catalog_floor) == (3, 300, 5)
        assert listener.poll(0.5) is None
        assert (listener.safe_ts, listener.catalog_floor) == (300, 5)
        stats = listener.stats()
        assert (stats.delivered, stats.superseded, stats.invalid, stats.other_clusters) == (1, 2, 1, 1)
        assert first.basis["n1"]["local_min"] == 300 and first.raw["cluster_wall_ms"] == WALL0 + 3


def test_listener_thread_calls_back_and_routes_expiries(kafka: EmbeddedBroker, directives_topic: str) -> None:
    produce(kafka.bootstrap, directives_topic, [("c1", directive(1, 100))])
    seen: list[Directive] = []
    expired: list[ExpireDirective] = []
    failures = {"left": 1}

    def on_directive(d: Directive) -> None:
        if d.seq == 2 and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("handler failed once")  # retried until it succeeds
        seen.append(d)

    listener = DirectiveListener(
        kafka.bootstrap,
        "c1",
        topic=directives_topic,
        node="n1",
        on_directive=on_directive,
        on_expire=expired.append,
        retry_backoff_s=0.05,
    ).start()
    try:
        wait_for(lambda: [d.seq for d in seen] == [1])
        produce(
            kafka.bootstrap,
            directives_topic,
            [
                expire(1, "n1", "r-1"),
                expire(1, "n1", "r-1"),  # repeat
                expire(2, "n2", "r-2"),  # another node: advances the seq, not delivered here
                ("c1", directive(2, 200)),
                expire(3, "n1", "r-3"),
            ],
        )
        wait_for(lambda: [d.seq for d in seen] == [1, 2] and len(expired) == 2)
        assert [(e.seq, e.reader_id, e.mode) for e in expired] == [(1, "r-1", "graceful"), (3, "r-3", "graceful")]
        assert listener.stats().handler_failures == 1
        with pytest.raises(Exception, match="background thread"):
            listener.poll(0)
    finally:
        listener.close()
    with pytest.raises(ClientClosed):
        listener.poll(0)


def snapshot_request(seq: int, node: str, cluster: str = "c1") -> tuple[str, dict[str, Any]]:
    value = {"v": 1, "type": "snapshot_request", "cluster": cluster, "node": node, "seq": seq, "reason": "recovery",
             "cluster_wall_ms": WALL0}
    jsonschema.Draft7Validator(load("outputs", "snapshot_request")).validate(value)
    return f"{cluster}/{node}", value


def test_listener_answers_snapshot_requests_through_its_reporter(
    kafka: EmbeddedBroker, events_topic: str, directives_topic: str
) -> None:
    """Backlog requests for this node are answered once, after the backlog; live ones each time, even
    when their seq does not advance (a job that lost its directives topic restarts it); other nodes'
    requests are not answered."""
    produce(kafka.bootstrap, directives_topic, [snapshot_request(4, "n1"), snapshot_request(5, "n1"),
                                               snapshot_request(6, "n2")])
    rep = make_reporter(kafka, events_topic)
    reader = rep.reader(500, reader_id="r-open").open()
    listener = DirectiveListener(kafka.bootstrap, reporter=rep, topic=directives_topic).start()
    try:
        wait_for(lambda: listener.stats().snapshot_requests == 1)
        produce(kafka.bootstrap, directives_topic, [snapshot_request(7, "n2"), snapshot_request(1, "n1")])
        wait_for(lambda: listener.stats().snapshot_requests == 2)
        time.sleep(0.5)
        assert listener.stats().snapshot_requests == 2
        assert rep.flush(10) == 0
        events = consume_events(kafka.bootstrap, events_topic, 3)
        assert [e["type"] for e in events] == ["reader_open", "snapshot", "snapshot"]
        assert [r["reader_id"] for r in events[1]["readers"]] == ["r-open"]
    finally:
        listener.close()
        reader.close()
        rep.close()


def band(seq: int, node: str, level: str, cluster: str = "c1") -> tuple[str, dict[str, Any]]:
    value = {"v": 1, "type": "band", "cluster": cluster, "node": node, "band": level, "seq": seq, "cluster_wall_ms": WALL0}
    jsonschema.Draft7Validator(load("outputs", "band")).validate(value)
    return f"{cluster}/{node}/%band", value


def test_listener_hands_the_band_to_its_reporter_which_admits_long_snapshots_by_it(
    kafka: EmbeddedBroker, events_topic: str, directives_topic: str
) -> None:
    """The newest band of this node (an older one or another node's is not taken) reaches the
    reporter: critical refuses long snapshots, short ones go on, nothing is published for a refused
    one, and the next heartbeat carries the count; a recovery snapshot_request sets it back to normal."""
    produce(kafka.bootstrap, directives_topic, [band(3, "n1", "warning"), band(4, "n1", "critical"),
                                               band(5, "n2", "normal"), band(2, "n1", "normal")])
    rep = make_reporter(kafka, events_topic)
    listener = DirectiveListener(kafka.bootstrap, reporter=rep, topic=directives_topic).start()
    try:
        wait_for(lambda: rep.band == "critical" and listener.stats().bands == 2)
        with pytest.raises(AdmissionRefused):
            rep.reader(500, reader_id="r-long", long=True).open()
        with rep.reader(500, reader_id="r-short"):
            pass
        assert rep.stats().admission_refused == 1
        rep.heartbeat()
        assert rep.flush(10) == 0
        events = consume_events(kafka.bootstrap, events_topic, 3)
        assert [e["type"] for e in events] == ["reader_open", "reader_close", "heartbeat"]
        assert events[2]["admission_refused"] == 1 and events[2]["admission_throttled"] == 0
        produce(kafka.bootstrap, directives_topic, [snapshot_request(6, "n1")])
        wait_for(lambda: rep.band == "normal")
        rep.reader(500, reader_id="r-long-2", long=True).open().close()
    finally:
        listener.close()
        rep.close()


def test_the_guides_report_is_admitted_throttled_and_refused_by_the_band(kafka: EmbeddedBroker, events_topic: str) -> None:
    """The operator guide's ``run_report``, as a database would call it, on a real reporter: it
    scans in normal, is told to retry after a while when a second one comes too soon in warning,
    and is refused in critical; short reads go on throughout."""
    scope: dict[str, Any] = {}
    exec(block("docs/operations.md", "from safepoint.errors import AdmissionRefused").text, scope)  # noqa: S102 - the guide's own code
    run_report = scope["run_report"]
    rep = make_reporter(kafka, events_topic, long_per_s=0.001)
    try:
        scanned: list[int] = []
        retry: list[float | None] = []
        scan, later = (lambda ts: scanned.append(ts) or "rows"), (lambda after: retry.append(after) or "later")
        assert run_report(rep, 900, scan, later) == "rows"
        rep.observe_band("warning")
        assert run_report(rep, 901, scan, later) == "rows", "a fresh bucket on entering the band"
        assert run_report(rep, 902, scan, later) == "later" and retry[-1] is not None and retry[-1] > 100
        rep.observe_band("critical")
        assert run_report(rep, 903, scan, later) == "later" and retry[-1] is None
        with rep.reader(904, reader_id="r-short"):
            pass
        assert scanned == [900, 901]
        stats = rep.stats()
        assert (stats.admission_throttled, stats.admission_refused) == (1, 1)
    finally:
        rep.close()


def test_an_emergency_on_the_directives_refuses_long_snapshots_in_the_warning_band(
    kafka: EmbeddedBroker, events_topic: str, directives_topic: str
) -> None:
    emergency = {**directive(1, 100), "emergency": {"since_wall_ms": WALL0, "compaction_budget": 4}}
    jsonschema.Draft7Validator(load("outputs", "compaction")).validate(emergency)
    produce(kafka.bootstrap, directives_topic, [band(1, "n1", "warning"), ("c1", emergency)])
    rep = make_reporter(kafka, events_topic)
    listener = DirectiveListener(kafka.bootstrap, reporter=rep, topic=directives_topic).start()
    try:
        wait_for(lambda: rep.band == "warning" and listener.stats().delivered == 1)
        last = listener.last_directive
        assert last is not None and last.emergency == {"since_wall_ms": WALL0, "compaction_budget": 4}
        with pytest.raises(AdmissionRefused, match="emergency"):
            rep.reader(500, reader_id="r-long", long=True).open()
        produce(kafka.bootstrap, directives_topic, [("c1", directive(2, 100))])  # the emergency is over
        wait_for(lambda: listener.stats().delivered == 2)
        rep.reader(500, reader_id="r-long-2", long=True).open().close()  # warning: within the rate
    finally:
        listener.close()
        rep.close()


def test_listener_waits_for_a_missing_topic_and_from_settings(kafka: EmbeddedBroker) -> None:
    topic = _name("late-directives")
    settings = Settings(bootstrap=kafka.bootstrap, directives_topic=topic, events_topic=_name("late-events"))
    with DirectiveListener.from_settings(settings, "c1") as listener:
        assert listener.topic == topic
        assert listener.poll(0.3) is None and not listener.caught_up  # the job has not created it yet
        ensure_topics(
            {"bootstrap.servers": kafka.bootstrap},
            [NewTopic(topic, num_partitions=1, replication_factor=1, config={"cleanup.policy": "compact"})],
        )
        produce(kafka.bootstrap, topic, [("c1", directive(1, 100))])
        assert poll_until(listener, lambda d: True).safe_ts == 100
    with Reporter.from_settings(settings, "n1", mvcc_clock=lambda: 5, heartbeat_interval_s=None) as rep:
        assert rep.topic == settings.events_topic and rep.bootstrap == kafka.bootstrap


# -- forced expiry (node side) -------------------------------------------------------------


def pump(listener: DirectiveListener, pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll the listener (expiries are applied in this thread) until ``pred`` holds."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        listener.poll(0.05)


def published(kafka: EmbeddedBroker, topic: str, rep: Reporter, n: int) -> list[tuple[str, str]]:
    """(type, reader_id / tx_id[:outcome]) of exactly the ``n`` events published so far."""
    assert rep.flush(10) == 0
    out: list[tuple[str, str]] = []
    for e in consume_events(kafka.bootstrap, topic, n):
        ident = str(e.get("reader_id") or e.get("tx_id"))
        out.append((e["type"], f"{ident}:{e['outcome']}" if "outcome" in e else ident))
    return out


def test_graceful_expiry_raises_at_the_next_check_and_releases_the_reader(
    kafka: EmbeddedBroker, events_topic: str, directives_topic: str
) -> None:
    calls: list[tuple[Handle, ExpireDirective, bool]] = []
    user: list[ExpireDirective] = []
    with (
        make_reporter(kafka, events_topic, on_expire=lambda h, d: calls.append((h, d, h.is_open))) as rep,
        DirectiveListener(kafka.bootstrap, topic=directives_topic, reporter=rep, on_expire=user.append) as listener,
    ):
        pump(listener, lambda: listener.caught_up)
        with pytest.raises(ReaderExpired) as info, rep.reader(100, reader_id="r-1", label="report") as r:
            r.check()  # not expired: a no-op
            produce(kafka.bootstrap, directives_topic, [expire(1, "n1", "r-1")])
            pump(listener, lambda: r.expired)
            # Graceful: the reporter's callback ran, the user's listener callback too, and the
            # reader is still held (the job keeps protecting it) until the next boundary.
            assert [(h, d.seq, d.mode, still_open) for h, d, still_open in calls] == [(r, 1, "graceful", True)]
            assert [d.reader_id for d in user] == ["r-1"]
            assert r.is_open and rep.active_readers == [r]
            assert published(kafka, events_topic, rep, 1) == [("reader_open", "r-1")]
            r.check()
            pytest.fail("check() must raise")
        err = info.value
        assert (err.kind, err.ident, err.mode, err.reason, err.seq) == ("reader", "r-1", "graceful", "pinned_bytes critical", 1)
        assert err.code == "snapshot_expired"
        assert str(err).startswith("reader r-1 (report) at read_ts 100 on node n1 was expired by the safe-point service")
        assert "graceful expiry, directive seq 1): pinned_bytes critical" in str(err)
        assert "retry it with a fresh snapshot" in str(err)
        assert not r.is_open and rep.active_readers == []
        with pytest.raises(ReaderExpired):
            r.check()  # every later boundary raises too
        # A graceful expiry of a reader whose block ends before any boundary: it just closes.
        with rep.reader(110, reader_id="r-2") as r2:
            produce(kafka.bootstrap, directives_topic, [expire(2, "n1", "r-2")])
            pump(listener, lambda: r2.expired)
        assert published(kafka, events_topic, rep, 4) == [
            ("reader_open", "r-1"),
            ("reader_close", "r-1"),
            ("reader_open", "r-2"),
            ("reader_close", "r-2"),
        ]
        stats = rep.stats()
        assert (stats.expired, stats.expiries_ignored, stats.expire_callback_failures) == (2, 0, 0)
        assert listener.stats().expires_delivered == 2


def test_hard_expiry_releases_the_reader_at_once(kafka: EmbeddedBroker, events_topic: str, directives_topic: str) -> None:
    with (
        make_reporter(kafka, events_topic) as rep,
        DirectiveListener(kafka.bootstrap, topic=directives_topic, reporter=rep) as listener,
    ):
        cancelled: list[tuple[str, str, bool]] = []

        def cancel(h: Handle, d: ExpireDirective) -> None:  # the node cancels the running query
            cancelled.append((h.reader_id if isinstance(h, Reader) else "?", d.mode, h.is_open))

        pump(listener, lambda: listener.caught_up)
        # A user exception in the block is never swallowed, and the reader's close is not repeated.
        with pytest.raises(RuntimeError, match="query cancelled"), rep.reader(100, reader_id="r-1", on_expire=cancel) as r:
            produce(kafka.bootstrap, directives_topic, [expire(1, "n1", "r-1", mode="hard")])
            pump(listener, lambda: r.expired)
            # The callback ran while the reader was still held; then the reporter released it.
            assert cancelled == [("r-1", "hard", True)]
            assert not r.is_open and rep.active_readers == []
            assert published(kafka, events_topic, rep, 2) == [("reader_open", "r-1"), ("reader_close", "r-1")]
            with pytest.raises(ReaderExpired, match=r"reader r-1 at read_ts 100 .*\(hard expiry, directive seq 1\)"):
                r.check()
            raise RuntimeError("query cancelled")
        # A block that ends normally after a hard expiry raises: what it read after the release
        # was not protected from compaction.
        with pytest.raises(ReaderExpired, match="hard expiry"), rep.reader(110, reader_id="r-2") as r2:
            produce(kafka.bootstrap, directives_topic, [expire(2, "n1", "r-2", mode="hard")])
            pump(listener, lambda: r2.expired)
        # Graceful first, then hard after the grace period: the escalation releases it.
        modes: list[str] = []
        with pytest.raises(ReaderExpired, match="hard expiry, directive seq 4"):
            with rep.reader(120, reader_id="r-3", on_expire=lambda h, d: modes.append(d.mode)) as r3:
                produce(kafka.bootstrap, directives_topic, [expire(3, "n1", "r-3")])
                pump(listener, lambda: r3.expired)
                assert r3.is_open
                produce(kafka.bootstrap, directives_topic, [expire(4, "n1", "r-3", mode="hard")])
                pump(listener, lambda: not r3.is_open)
                r3.check()
        assert modes == ["graceful", "hard"]
        assert published(kafka, events_topic, rep, 6) == [
            ("reader_open", "r-1"),
            ("reader_close", "r-1"),
            ("reader_open", "r-2"),
            ("reader_close", "r-2"),
            ("reader_open", "r-3"),
            ("reader_close", "r-3"),
        ]
        assert (rep.stats().expired, rep.stats().expiries_ignored) == (4, 0)


def test_expiry_of_unknown_closed_other_node_or_prepared_is_a_noop(
    kafka: EmbeddedBroker, events_topic: str, directives_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="safepoint.reporter")
    with (
        make_reporter(kafka, events_topic) as rep,
        DirectiveListener(kafka.bootstrap, topic=directives_topic, reporter=rep) as listener,
    ):
        pump(listener, lambda: listener.caught_up)
        with rep.reader(100, reader_id="r-closed"):
            pass
        r = rep.reader(100, reader_id="r-open").open()
        prepared = rep.transaction(100, tx_id="t-prepared").begin()
        prepared.prepare("n2", ["n1", "n2"])
        produce(
            kafka.bootstrap,
            directives_topic,
            [
                expire(1, "n1", "r-unknown", mode="hard"),
                expire(2, "n1", "r-closed", mode="hard"),
                expire(3, "n1", "t-prepared", kind="tx", mode="hard"),
                expire(4, "n2", "r-open", mode="hard"),  # another node's reader of the same id
                expire(5, "n1", "r-open"),
                expire(6, "n1", "r-open"),  # a repeat of a graceful expiry under a new seq
            ],
        )
        pump(listener, lambda: listener.stats().expires_delivered == 5)
        stats = rep.stats()
        assert (stats.expired, stats.expiries_ignored) == (1, 4)
        assert r.expired and r.is_open and r.expiry is not None and r.expiry.seq == 5
        assert prepared.is_open and prepared.prepared and not prepared.expired
        assert rep.active_transactions == [prepared]
        warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
        assert any("t-prepared ignored: it is prepared" in m for m in warnings), warnings
        prepared.end("commit", commit_ts=150)  # its coordinator decides, not the job
        r.close()
        assert published(kafka, events_topic, rep, 7) == [
            ("reader_open", "r-closed"),
            ("reader_close", "r-closed"),
            ("reader_open", "r-open"),
            ("tx_begin", "t-prepared"),
            ("tx_prepare", "t-prepared"),
            ("tx_end", "t-prepared:commit"),
            ("reader_close", "r-open"),
        ]


def test_backlog_expiries_of_an_earlier_process_are_skipped(
    kafka: EmbeddedBroker, events_topic: str, directives_topic: str
) -> None:
    # The compacted topic still holds expiries decided before this process started.
    with make_reporter(kafka, events_topic, incarnation=8, wall_clock=Clock(start=WALL0 + 10_000)) as rep:
        live = rep.reader(100, reader_id="r-live").open()
        reused = rep.transaction(100, tx_id="t-reused").begin()  # an id the earlier process used too
        produce(
            kafka.bootstrap,
            directives_topic,
            [
                expire(1, "n1", "r-dead", mode="hard", cluster_wall_ms=WALL0 + 1),
                expire(2, "n1", "t-reused", kind="tx", mode="hard", cluster_wall_ms=WALL0 + 2),  # before its open
                expire(3, "n1", "t-dead", kind="tx", cluster_wall_ms=WALL0 + 3),
                expire(4, "n1", "r-live", mode="hard", cluster_wall_ms=WALL0 + 20_000),
            ],
        )
        user: list[ExpireDirective] = []
        with DirectiveListener(kafka.bootstrap, topic=directives_topic, reporter=rep, on_expire=user.append) as listener:
            pump(listener, lambda: listener.caught_up)
            stats = listener.stats()
            assert (stats.backlog_expires_skipped, stats.expires_delivered) == (2, 2)
            assert [d.seq for d in user] == [2, 4]
            assert live.expired and not live.is_open
            assert not reused.expired and reused.is_open  # the directive predates this transaction
            assert (rep.stats().expired, rep.stats().expiries_ignored) == (1, 1)
            # After the backlog, an expiry of an unknown id is still delivered (and a no-op).
            produce(kafka.bootstrap, directives_topic, [expire(5, "n1", "r-gone")])
            pump(listener, lambda: listener.stats().expires_delivered == 3)
            assert listener.stats().backlog_expires_skipped == 2 and rep.stats().expiries_ignored == 2
        reused.end("commit")
        assert published(kafka, events_topic, rep, 4) == [
            ("reader_open", "r-live"),
            ("tx_begin", "t-reused"),
            ("reader_close", "r-live"),
            ("tx_end", "t-reused:commit"),
        ]


def test_expired_transaction_cannot_commit_and_publishes_abort(
    kafka: EmbeddedBroker, events_topic: str, directives_topic: str
) -> None:
    seen: list[str] = []
    with (
        make_reporter(kafka, events_topic, on_expire=lambda h, d: seen.append(f"reporter:{d.seq}")) as rep,
        DirectiveListener(kafka.bootstrap, topic=directives_topic, reporter=rep) as listener,
    ):
        pump(listener, lambda: listener.caught_up)
        # Graceful: the commit at the end of the block is the cancel point.
        with pytest.raises(ReaderExpired) as info, rep.transaction(200, tx_id="t-1", label="etl") as tx:
            produce(kafka.bootstrap, directives_topic, [expire(1, "n1", "t-1", kind="tx")])
            pump(listener, lambda: tx.expired)
            assert tx.is_open
        assert (info.value.kind, info.value.ident, info.value.mode) == ("tx", "t-1", "graceful")
        assert "transaction t-1 (etl) at begin_ts 200" in str(info.value)
        assert "aborted and did not commit; retry it with a fresh snapshot" in str(info.value)
        assert (tx.outcome, tx.is_open) == ("abort", False)
        # An explicit commit raises too; prepare() is a cancel point as well.
        tx2 = rep.transaction(210, tx_id="t-2", on_expire=lambda h, d: seen.append(f"handle:{d.seq}")).begin()
        tx3 = rep.transaction(220, tx_id="t-3").begin()
        produce(kafka.bootstrap, directives_topic, [expire(2, "n1", "t-2", kind="tx"), expire(3, "n1", "t-3", kind="tx")])
        pump(listener, lambda: tx2.expired and tx3.expired)
        with pytest.raises(ReaderExpired, match="transaction t-2"):
            tx2.end("commit", commit_ts=230)
        with pytest.raises(ReaderExpired, match="transaction t-3"):
            tx3.prepare("n2", ["n1", "n2"])
        tx2.end("abort")  # idempotent, no error
        # Hard: aborted by the reporter at once; a user exception in the block propagates.
        with pytest.raises(KeyError), rep.transaction(240, tx_id="t-4") as tx4:
            produce(kafka.bootstrap, directives_topic, [expire(4, "n1", "t-4", kind="tx", mode="hard")])
            pump(listener, lambda: not tx4.is_open)
            with pytest.raises(ReaderExpired, match="hard expiry"):
                tx4.check()
            raise KeyError("row")
        assert seen == ["reporter:1", "handle:2", "reporter:3", "reporter:4"]
        assert rep.active_transactions == []
        assert published(kafka, events_topic, rep, 8) == [
            ("tx_begin", "t-1"),
            ("tx_end", "t-1:abort"),
            ("tx_begin", "t-2"),
            ("tx_begin", "t-3"),
            ("tx_end", "t-2:abort"),
            ("tx_end", "t-3:abort"),
            ("tx_begin", "t-4"),
            ("tx_end", "t-4:abort"),
        ]


def test_on_expire_failure_is_logged_and_the_expiry_still_applies(kafka: EmbeddedBroker, events_topic: str) -> None:
    def broken(h: Handle, d: ExpireDirective) -> None:
        raise RuntimeError("cancel failed")

    with make_reporter(kafka, events_topic, on_expire=broken) as rep:
        r = rep.reader(100, reader_id="r-1").open()
        _, value = expire(1, "n1", "r-1", mode="hard")
        assert rep.expire(ExpireDirective.from_json(value)) is r
        assert rep.expire(ExpireDirective.from_json(value)) is None  # already released: a no-op
        assert not r.is_open and rep.stats().expire_callback_failures == 1
        with pytest.raises(ReaderExpired):
            r.check()
        assert published(kafka, events_topic, rep, 2) == [("reader_open", "r-1"), ("reader_close", "r-1")]

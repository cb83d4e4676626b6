"""``safepoint check-node`` on the real broker: a conforming Reporter passes, a broken producer
has each of its departures named once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from safepoint.cli import main
from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.connectors.reporter import Reporter
from safepoint.settings import load_settings

from kafka_util import produce, unique

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


def events_topic(bootstrap: str) -> str:
    tag = unique("checknode")
    settings = load_settings(flags={"bootstrap": bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control",
                                    "directives_topic": f"{tag}.d", "alerts_topic": f"{tag}.a",
                                    "deadletter_topic": f"{tag}.dl"}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 1, log_append_time=False))  # one partition: the read order is the sent order
    return settings.events_topic


def check_node(bootstrap: str, topic: str, capsys: Any, *extra: str) -> tuple[int, dict[str, Any]]:
    rc = main(["check-node", "--bootstrap", bootstrap, "--events-topic", topic, "--cluster", "c1", "--node", "n1",
               "--duration", "4", "--from-beginning", "--node-lease-ms", "10000", "--retention", "100", "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_a_conforming_reporter_passes(broker: Any, capsys: Any) -> None:
    topic = events_topic(broker.bootstrap)
    clock = iter(range(1_000, 10**9, 10))
    with Reporter(broker.bootstrap, "n1", cluster="c1", topic=topic, mvcc_clock=lambda: next(clock),
                  heartbeat_interval_s=None,
                  figures=lambda: {"groups": [{"group": "g", "leader": True, "published_min_tx_time": 900}]}) as rep:
        rep.heartbeat()
        with rep.reader(label="report"):
            rep.heartbeat()
        with rep.transaction() as tx:
            tx.prepare(coordinator="n2", participants=["n1", "n2"])
        rep.snapshot()
        rep.heartbeat()
        assert rep.flush(10) == 0
    rc, report = check_node(broker.bootstrap, topic, capsys)
    assert report["findings"] == [] and report["events"] >= 8
    assert rc == 0 and report["conforms"] is True


def test_a_broken_producer_has_each_departure_named_once(broker: Any, capsys: Any) -> None:
    topic = events_topic(broker.bootstrap)

    def ev(kind: str, seq: int, wall: int, inc: int = 5, **fields: Any) -> dict[str, Any]:
        return {"v": 1, "type": kind, "cluster": "c1", "node": "n1", "incarnation": inc, "seq": seq, "wall_ms": wall, **fields}

    leader = [{"group": "g", "leader": True, "published_min_tx_time": None}]
    produce(broker.bootstrap, topic, [
        ("n1", ev("heartbeat", 1, 0, mvcc_now=1_000, groups=leader)),
        ("n1", ev("reader_open", 2, 10, reader_id="r1", read_ts=950)),
        ("n1", '{"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n1"}'),  # invalid: missing fields
        ("n1", ev("heartbeat", 2, 20, mvcc_now=1_010, groups=leader)),            # seq repeated
        ("n1", ev("heartbeat", 6, 30, mvcc_now=1_020, groups=leader)),            # seq gap
        ("n1", ev("heartbeat", 3, 40, mvcc_now=1_030, groups=leader)),            # seq back
        ("c1", ev("heartbeat", 7, 50, mvcc_now=1_040, groups=leader)),            # keyed by the cluster
        ("n1", ev("reader_close", 8, 60, reader_id="never-opened")),
        ("n1", ev("heartbeat", 9, 30_000, mvcc_now=2_000, groups=leader)),        # 30 s after the last one
        ("n1", ev("snapshot", 10, 30_010, cut=2_000, readers=[{"reader_id": "r1", "read_ts": 950},
                                                               {"reader_id": "ghost", "read_ts": 5}], txs=[])),
        ("n1", ev("heartbeat", 1, 30_020, inc=4, mvcc_now=2_010, groups=leader)),  # incarnation back
    ])
    rc, report = check_node(broker.bootstrap, topic, capsys)
    assert rc == 1 and report["conforms"] is False
    assert [f["check"] for f in report["findings"]] == [
        "invalid", "key", "seq_repeat", "seq_back", "seq_gap", "incarnation_back", "heartbeat_sparse", "close_unknown",
        "unpublished_hold", "leader_never_publishes"]
    assert {f["check"]: f["count"] for f in report["findings"] if f["count"] != 1} == {}
    rc = main(["check-node", "--bootstrap", broker.bootstrap, "--events-topic", topic, "--cluster", "c1", "--node", "n1",
               "--duration", "3", "--from-beginning", "--node-lease-ms", "10000", "--retention", "100"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 1 and len(lines) == 11 and lines[-1].endswith("10 departure(s)")
    assert lines[0].startswith("invalid: an event the job dead-letters (missing_field")


def test_a_lazy_reporter_conforms_judged_by_the_retention_its_job_announces(broker: Any, capsys: Any) -> None:
    """A Reporter with lazy registration leaves the readers above its bound unpublished by design;
    without --retention, check-node takes the job's retention from the cluster's newest directive
    (with 0 it would call the snapshot's reader an unpublished hold)."""
    topic = events_topic(broker.bootstrap)
    directives = topic.replace(".events", ".d")
    clock = iter(range(1_000, 10**9, 10))
    with Reporter(broker.bootstrap, "n1", cluster="c1", topic=topic, mvcc_clock=lambda: next(clock),
                  heartbeat_interval_s=None, retention=100) as rep:
        rep.heartbeat()
        with rep.reader(label="short"):
            rep.heartbeat()   # its ts is above this heartbeat's bound: never published
            rep.snapshot()    # ... but named in the snapshot
        rep.heartbeat()
        assert rep.flush(10) == 0
    base = ["check-node", "--bootstrap", broker.bootstrap, "--events-topic", topic, "--directives-topic", directives,
            "--cluster", "c1", "--node", "n1", "--duration", "3", "--from-beginning", "--node-lease-ms", "10000", "--json"]
    rc = main(base)
    eager = json.loads(capsys.readouterr().out)
    assert rc == 1 and [f["check"] for f in eager["findings"]] == ["unpublished_hold"] and eager["retention"] == 0
    assert "--retention" in eager["findings"][0]["what"]
    produce(broker.bootstrap, directives, [("c1", {"v": 1, "type": "compaction", "cluster": "c1", "seq": 7,
                                                   "safe_ts": 900, "retention": 100})])
    rc = main(base)
    judged = json.loads(capsys.readouterr().out)
    assert judged["retention"] == 100 and judged["findings"] == [] and rc == 0
    rc = main([*base, "--retention", "0"])  # a flag wins over the directive
    assert rc == 1 and json.loads(capsys.readouterr().out)["retention"] == 0

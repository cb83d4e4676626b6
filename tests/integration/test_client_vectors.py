"""The shared test vectors (``schemas/vectors/``, read by ``vectors.py``) through each client's driver
against a broker: every client publishes what the vector says, in its order (but for the fields that
carry the time), each record with the key and headers it says, answers each operation as it says, hands the expiries it names to the handles, and
conforms to the contract as ``safepoint check-node`` reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from safepoint.cli import main as cli
from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.devtools.client_driver import DRIVERS
from safepoint.devtools.driver_node import DriverNode

from kafka_util import read_topic, unique
from vectors import load, run, vectors

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("language", sorted(DRIVERS))
@pytest.mark.parametrize("path", vectors(), ids=lambda p: p.stem)
def test_the_client_does_what_the_vector_says(broker: Any, path: Path, language: str) -> None:
    vector = load(path)
    ran = run(DRIVERS[language], broker.bootstrap, vector)
    assert ran.replies == vector["replies"], ran.stderr[-2000:]
    assert sorted(ran.expired, key=lambda e: e["ref"]) == vector["expired"]
    assert ran.events == vector["events"]
    assert ran.records == [vector["record"]] * len(ran.events), "each record keyed by the node, its cluster in a header"
    if vector["args"].get("node_key"):
        assert ran.signed == len(ran.events), "every event signed with the node's key"


@pytest.mark.parametrize("language", sorted(DRIVERS))
def test_every_vector_conforms_to_the_contract(broker: Any, capsys: pytest.CaptureFixture[str], language: str) -> None:
    """What the vectors make each client's node publish is what ``safepoint check-node`` accepts (the
    reference a client in a fourth language checks itself against)."""
    for path in vectors():
        vector = load(path)
        ran = run(DRIVERS[language], broker.bootstrap, vector)
        topic = ran.events_topic
        argv = ["check-node", "--bootstrap", broker.bootstrap, "--events-topic", topic, "--cluster", vector["cluster"],
                "--node", vector["node"], "--from-beginning", "--duration", "1"]
        if vector["args"].get("retention") is not None:
            argv += ["--retention", str(vector["args"]["retention"])]
        assert cli(argv) == 0, f"{path.name}: {capsys.readouterr().out[-2000:]}"


@pytest.mark.parametrize("language", sorted(DRIVERS))
def test_the_benchmarks_load_is_the_same_in_every_client(broker: Any, language: str) -> None:
    """The driver's ``publish`` (what ``safepoint bench --phases clients`` times): every client opens
    and closes the same readers, publishes the same events and says how many."""
    tag = unique("publish")
    topics = {name: f"{tag}.{name}" for name in ("events", "directives", "alerts", "deadletter")}
    ensure_topics({"bootstrap.servers": broker.bootstrap}, topic_specs(topics, 1, log_append_time=False))
    node = DriverNode(language, broker.bootstrap, "c1", "n1", topics["events"], topics["directives"], f"{tag}.control",
                f"{tag}.status", heartbeat_ms=0)
    try:
        node.ok({"op": "clock", "mvcc_now": 500})
        reply = node.do({"op": "publish", "ref": "b", "readers": 300})
        assert reply["events"] == 600 and reply["ms"] >= 0, f"{reply}\n{node.stderr()}"
    finally:
        assert node.finish() == 0
    events = read_topic(broker.bootstrap, topics["events"])
    assert [(e["type"], e.get("reader_id"), e.get("read_ts"), e["seq"]) for e in events] == [
        (kind, f"b-{i}", 500 if kind == "reader_open" else None, 2 * i + (kind == "reader_close"))
        for i in range(300) for kind in ("reader_open", "reader_close")]

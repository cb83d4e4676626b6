"""Start-time checks of a checkpoint, before any batch: other node_buckets, an earlier layout of the
state. (A checkpoint that has read past the end of a recreated events topic is no longer refused:
the source takes it as a gap, ``test_gaps_e2e.py``.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.errors import ConfigError
from safepoint.settings import Settings, load_settings
from safepoint.streaming.checkpoint import LAYOUT_FILE
from safepoint.streaming.job import build_query

from kafka_util import produce, unique
from tests_support import _ids, make_settings, run_to_end, send, simulated_log, verify

pytestmark = pytest.mark.integration


def settings_for(bootstrap: str) -> Settings:
    tag = unique("ckcheck")
    settings = load_settings(flags={
        "bootstrap": bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "node_lease_ms": 1_000}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2, log_append_time=False))
    return settings


def heartbeats(n: int, node: str = "n1") -> list[tuple[str, dict[str, Any]]]:
    return [(node, {"v": 1, "type": "heartbeat", "node": node, "incarnation": 0, "seq": i, "wall_ms": 1_000 * i,
                    "mvcc_now": 100 * i}) for i in range(n)]


def test_other_node_buckets_are_refused_before_any_batch(broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = settings_for(broker.bootstrap)
    produce(broker.bootstrap, settings.events_topic, heartbeats(5))
    ckpt = tmp_path / "ckpt"
    run_to_end(spark, settings, str(ckpt))
    assert (ckpt / LAYOUT_FILE).exists()
    active = len(spark.streams.active)
    with pytest.raises(ConfigError) as err:
        build_query(spark, settings.with_overrides(node_buckets=4), str(ckpt))
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"node_buckets is 4 but checkpoint {ckpt} was written with 8: set node_buckets = 8 again")
    assert len(spark.streams.active) == active, "no query was started"


def test_a_checkpoint_of_the_retired_plain_path_is_refused(broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = settings_for(broker.bootstrap)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / LAYOUT_FILE).write_text('{"fast_path": false, "format": 1, "node_buckets": 8}\n')  # as 0.1 wrote it
    with pytest.raises(ConfigError) as err:
        build_query(spark, settings, str(ckpt))
    assert str(err.value).startswith(f"checkpoint {ckpt} was written by the plain path (fast_path = false), which this "
                                     "version no longer has: start from a new checkpoint directory")


def test_a_checkpoint_of_two_stateful_operators_is_refused(broker: Any, spark: Any, tmp_path: Path) -> None:
    """A checkpoint the two-operator job wrote (layout 1) holds state this operator cannot read:
    refused before any batch, with what to do."""
    settings = settings_for(broker.bootstrap)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / LAYOUT_FILE).write_text('{"format": 1, "node_buckets": 8}\n')  # as the two-operator job wrote it
    active = len(spark.streams.active)
    with pytest.raises(ConfigError) as err:
        build_query(spark, settings, str(ckpt))
    assert str(err.value).startswith(f"checkpoint {ckpt} holds state in layout 1 (an earlier safepoint's two stateful "
                                     "operators), and this version keeps it in layout 2 (one operator): start from a "
                                     "new checkpoint directory")
    assert len(spark.streams.active) == active, "no query was started"
    # a new checkpoint records the layout it is written in
    fresh = tmp_path / "fresh"
    produce(broker.bootstrap, settings.events_topic, heartbeats(3))
    run_to_end(spark, settings, str(fresh))
    assert '"format": 2' in (fresh / LAYOUT_FILE).read_text()


def test_a_checkpoint_written_with_lz4_state_resumes_with_its_codec(broker: Any, spark: Any, tmp_path: Path) -> None:
    """The job compresses its state with zstd (``streaming/session.py``); a checkpoint a version
    before wrote with lz4 resumes on lz4 (Spark keeps the codec in the offset log) and loses
    nothing: its outputs are replay's, as in the fault tests."""
    settings = make_settings(broker.bootstrap, "codec", 3, retention=1_000_000, node_lease_ms=3_000)
    log, closing = simulated_log(seed=31, duration_ms=6_000)
    ckpt = tmp_path / "ckpt"
    codec = "spark.sql.streaming.stateStore.compression.codec"
    assert spark.conf.get(codec) == "zstd"
    send(broker.bootstrap, settings.events_topic, log[: len(log) // 2])
    spark.conf.set(codec, "lz4")
    try:
        run_to_end(spark, settings, str(ckpt))
    finally:
        spark.conf.set(codec, "zstd")
    send(broker.bootstrap, settings.events_topic, [*log[len(log) // 2:], closing])
    run_to_end(spark, settings, str(ckpt))
    batches = _ids(ckpt, "offsets")
    assert len(batches) >= 2
    for b in batches:
        assert f'"{codec}":"lz4"' in (ckpt / "offsets" / str(b)).read_text(), f"batch {b} changed codec"
    done = verify(broker.bootstrap, settings, ckpt)
    assert done.directives["c1"], "directives came out"

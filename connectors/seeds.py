"""Reading the compacted directives topic at the job's start: the seed of each cluster.

A job that starts on empty state (no committed batch in its checkpoint) reads every directive
the topic holds, keeps the newest compaction directive of each cluster and the highest per-node
directive ``seq``, and starts those clusters from there (``safepoint.core.recovery``): nothing
goes back and ``seq`` continues, so every node's listener accepts the new job's directives.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from safepoint.connectors.delivery import RECEIVE_MESSAGE_MAX_BYTES
from safepoint.core.recovery import Seed, seeds_from_directives
from safepoint.errors import BrokerError

__all__ = ["read_directive_values", "read_seeds"]

log = logging.getLogger("safepoint.seeds")


def read_directive_values(conf: dict[str, Any], topic: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Every JSON object the topic holds now, from its first offset to its end (tombstones and
    values that are not JSON objects are skipped). Empty when the topic does not exist."""
    consumer = Consumer({**conf, "group.id": "safepoint-seed-reader", "enable.auto.commit": False,
                         "enable.partition.eof": True, "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
                         "logger": logging.getLogger("safepoint.seeds.librdkafka")})
    deadline = time.monotonic() + timeout_s
    values: list[dict[str, Any]] = []
    try:
        try:
            meta = consumer.list_topics(topic, timeout=min(10.0, timeout_s)).topics.get(topic)
        except KafkaException as exc:
            msg = f"cannot read the metadata of {topic} at {conf.get('bootstrap.servers')}: {exc}"
            raise BrokerError(msg) from exc
        if meta is None or meta.error is not None or not meta.partitions:
            return values
        ends: dict[int, int] = {}
        assign: list[TopicPartition] = []
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=min(10.0, timeout_s))
            if high > low:
                ends[p] = high
                assign.append(TopicPartition(topic, p, low))
        if not assign:
            return values
        consumer.assign(assign)
        while ends:
            if time.monotonic() > deadline:
                msg = (f"reading {topic} to seed the job did not finish within {timeout_s:.0f} s "
                       f"(partitions left: {sorted(ends)})")
                raise BrokerError(msg)
            msg_ = consumer.poll(1.0)
            if msg_ is None:
                continue
            err = msg_.error()
            partition, offset = msg_.partition() or 0, msg_.offset() or 0
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    ends.pop(partition, None)
                continue
            if offset >= ends.get(partition, 0) - 1:
                ends.pop(partition, None)
            raw = msg_.value()
            if raw is None:
                continue
            try:
                value = json.loads(raw)
            except (UnicodeDecodeError, ValueError):
                continue
            if isinstance(value, dict):
                values.append(value)
    finally:
        consumer.close()
    return values


def read_seeds(conf: dict[str, Any], topic: str, timeout_s: float = 60.0) -> dict[str, Seed]:
    """The seed of every cluster the directives topic knows."""
    seeds = seeds_from_directives(read_directive_values(conf, topic, timeout_s))
    for cluster, seed in seeds.items():
        log.info("cluster %s: seeded from %s: safe_ts %s, catalog_floor %s, seq %d, node seq %d, %d node(s)",
                 cluster, topic, seed.safe_ts, seed.catalog_floor, seed.seq, seed.node_seq, len(seed.nodes))
    return seeds

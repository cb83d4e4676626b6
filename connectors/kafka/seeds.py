"""Reading the compacted directives topic at the job's start: the seed of each cluster.

A job that starts on empty state (no committed batch in its checkpoint) reads every directive
the topic holds, keeps the newest compaction directive of each cluster and the highest per-node
directive ``seq``, and starts those clusters from there (``safepoint.core.recovery``): nothing
goes back and ``seq`` continues, so every node's listener accepts the new job's directives. Where a
cluster's directives are signed (``directive_keys``), only those signed by one of its keys (the
public halves of every key listed, for a rotation) seed it: a forged directive on the topic cannot set
a new job's floor.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from safepoint.connectors.kafka.follow import read_to_end
from safepoint.core.recovery import Seed, seeds_from_directives
from safepoint.core.signing import verify_directive
from safepoint.errors import BrokerError

__all__ = ["read_directive_values", "read_seeds"]

log = logging.getLogger("safepoint.seeds")


def read_directive_values(conf: dict[str, Any], topic: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Every JSON object the topic holds now, from its first offset to its end (tombstones and
    values that are not JSON objects are skipped). Empty when the topic does not exist."""
    values: list[dict[str, Any]] = []
    try:
        for m in read_to_end({**conf, "logger": logging.getLogger("safepoint.seeds.librdkafka")}, topic, timeout_s,
                             client_id="safepoint-seed-reader"):
            raw = m.value()
            if raw is None:
                continue
            try:
                value = json.loads(raw)
            except (UnicodeDecodeError, ValueError):
                continue
            if isinstance(value, dict):
                values.append(value)
    except TimeoutError as exc:
        msg = f"reading {topic} to seed the job did not finish: {exc}"
        raise BrokerError(msg) from exc
    return values


def read_seeds(conf: dict[str, Any], topic: str, timeout_s: float = 60.0,
               public_keys: Callable[[str], list[str]] | None = None) -> dict[str, Seed]:
    """The seed of every cluster the directives topic knows; with ``public_keys`` (a cluster's keys that
    sign its directives: none, they are not signed), only its signed directives count."""
    values = read_directive_values(conf, topic, timeout_s)
    if public_keys is not None:
        kept = []
        for value in values:
            keys = public_keys(str(value.get("cluster", "")))
            why = verify_directive(value, keys) if keys else None
            if why is None:
                kept.append(value)
            else:
                log.warning("%s: a %s directive of cluster %s (seq %s) does not seed the job: %s", topic, value.get("type"),
                            value.get("cluster"), value.get("seq"), why)
        values = kept
    seeds = seeds_from_directives(values)
    for cluster, seed in seeds.items():
        log.info("cluster %s: seeded from %s: safe_ts %s, catalog_floor %s, seq %d, node seq %d, %d node(s)",
                 cluster, topic, seed.safe_ts, seed.catalog_floor, seed.seq, seed.node_seq, len(seed.nodes))
    return seeds

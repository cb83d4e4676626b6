"""What the job checks in its checkpoint before the query starts: one readable line instead of a
stack trace from inside a Spark task, or a silent stall.

* ``safepoint.json`` at the checkpoint's root records the layout of the job's state (``format``)
  and the settings a checkpoint is bound to (``node_buckets``); a start with another value is
  refused before any batch, and so is a checkpoint of an earlier layout: format 1 (two stateful
  operators) and the retired plain path (``fast_path = false``).
* With Spark's ``kafka`` format, the newest offsets the checkpoint planned must not be past the end
  of the events topic: if they are, the topic was deleted and recreated (or truncated) under the
  checkpoint, and that source would fail or read nothing. The project's own source takes such a
  partition as a gap instead (``gone_back``, ``core/gaps.py``): it alerts, reads the partition from
  its new start, and every node whose events were there restates its holds.
* Whether the checkpoint holds a committed batch at all: a start on empty state seeds the safe
  point from the directives topic (``core/recovery.py``).
* The job's ``generation`` (``job_generation``): the id of its state's lifetime, made when it starts
  on empty state and kept in ``safepoint.json``; every directive carries it (``Policy.generation``).

Files are read through Hadoop's FileSystem, so local paths, HDFS and S3 alike.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from safepoint.errors import ConfigError
from safepoint.settings import Settings

__all__ = ["GENERATION", "LAYOUT_FILE", "check_checkpoint", "check_layout", "check_offsets", "has_committed_batch",
           "job_generation", "offsets_of"]

LAYOUT_FILE = "safepoint.json"
LAYOUT_FORMAT = 2
"""The layout of the job's state: 1, two stateful operators (a node stage keyed by cluster and node
bucket, a cluster stage); 2, one operator keyed by cluster (``processors.ClusterJob``)."""
BOUND_KEYS = ("node_buckets",)
"""Settings a checkpoint's state is bound to: a change needs a new checkpoint."""


class _Fs:
    """The few Hadoop FileSystem calls the checks need."""

    def __init__(self, spark: Any, root: str) -> None:
        self.jvm = spark.sparkContext._jvm
        self.root = root.rstrip("/")
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()

    def path(self, *parts: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path("/".join((self.root, *parts)))

    def fs(self, path: Any) -> Any:
        return path.getFileSystem(self.conf)

    def names(self, *parts: str) -> list[str]:
        path = self.path(*parts)
        fs = self.fs(path)
        if not fs.exists(path):
            return []
        return [st.getPath().getName() for st in fs.listStatus(path) if not st.getPath().getName().startswith(".")]

    def read(self, *parts: str) -> str | None:
        path = self.path(*parts)
        fs = self.fs(path)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            return str(self.jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write(self, text: str, *parts: str) -> None:
        path = self.path(*parts)
        out = self.fs(path).create(path, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()


GENERATION = "generation"
"""The key of the job's generation in ``safepoint.json``."""


def job_generation(spark: Any, checkpoint: str, fresh: bool) -> str:
    """The id of the job's state's lifetime: a new one when the job starts on empty state (``fresh``:
    no committed batch) or the checkpoint has none yet (an earlier version's), else the one it keeps.
    Written to ``safepoint.json`` before the query starts."""
    fs = _Fs(spark, checkpoint)
    text = fs.read(LAYOUT_FILE)
    recorded = json.loads(text) if text else {}
    generation = recorded.get(GENERATION)
    if fresh or not isinstance(generation, str) or not generation:
        generation = secrets.token_hex(8)
        fs.write(json.dumps({**recorded, GENERATION: generation}, sort_keys=True) + "\n", LAYOUT_FILE)
    return generation


def has_committed_batch(spark: Any, checkpoint: str) -> bool:
    """True when the checkpoint holds a committed micro-batch (its ``commits/`` has an entry)."""
    return bool(_Fs(spark, checkpoint).names("commits"))


def check_layout(spark: Any, settings: Settings, checkpoint: str) -> None:
    """Refuse a checkpoint written with other bound settings; record them in a new one."""
    fs = _Fs(spark, checkpoint)
    mine = {k: getattr(settings, k) for k in BOUND_KEYS}
    text = fs.read(LAYOUT_FILE)
    if text is not None:
        recorded = json.loads(text)
        if recorded.get("fast_path") is False:
            msg = (f"checkpoint {checkpoint} was written by the plain path (fast_path = false), which this version no "
                   "longer has: start from a new checkpoint directory (the safe point is then seeded from the "
                   "directives topic)")
            raise ConfigError(msg)
        if recorded.get("format", 1) != LAYOUT_FORMAT:
            msg = (f"checkpoint {checkpoint} holds state in layout {recorded.get('format', 1)} (an earlier safepoint's "
                   f"two stateful operators), and this version keeps it in layout {LAYOUT_FORMAT} (one operator): start "
                   "from a new checkpoint directory; the safe point is then seeded from the directives topic and "
                   "every node is asked for a snapshot (operator guide, Losing a checkpoint)")
            raise ConfigError(msg)
        for key in BOUND_KEYS:
            if key in recorded and recorded[key] != mine[key]:
                msg = (f"{key} is {json.dumps(mine[key])} but checkpoint {checkpoint} was written with "
                       f"{json.dumps(recorded[key])}: set {key} = {json.dumps(recorded[key])} again, or start from a "
                       "new checkpoint directory (the safe point is then seeded from the directives topic)")
                raise ConfigError(msg)
        return
    fs.write(json.dumps({"format": LAYOUT_FORMAT, **mine}, sort_keys=True) + "\n", LAYOUT_FILE)


def offsets_of(line: str, topic: str) -> dict[int, int] | None:
    """One source's offsets from a line of Spark's offset log: the Python source writes
    ``{"<partition>": offset}``, Spark's kafka source ``{"<topic>": {"<partition>": offset}}``."""
    line = line.strip()
    if not line or line == "-":
        return None
    data = json.loads(line)
    if not isinstance(data, dict):
        return None
    if isinstance(data.get(topic), dict):
        data = data[topic]
    try:
        return {int(p): int(o) for p, o in data.items() if p.isdigit()}
    except (TypeError, ValueError):
        return None


def newest_offsets(spark: Any, checkpoint: str, topic: str) -> tuple[int, dict[int, int]] | None:
    """(batch id, ``topic``'s offsets) of the newest batch the checkpoint planned, or None."""
    fs = _Fs(spark, checkpoint)
    batches = sorted(int(n) for n in fs.names("offsets") if n.isdigit())
    if not batches:
        return None
    text = fs.read("offsets", str(batches[-1])) or ""
    for line in text.splitlines()[2:]:  # "v1", the batch metadata, then one line per source
        offsets = offsets_of(line, topic)
        if offsets is not None:
            return batches[-1], offsets
    return None


def check_offsets(batch: int, offsets: dict[int, int], ends: dict[int, int], topic: str, checkpoint: str) -> None:
    """Refuse a checkpoint that has read past the end of ``topic`` (recreated or truncated)."""
    for partition in sorted(offsets):
        end = ends.get(partition)
        if end is None or offsets[partition] > end:
            now = "does not exist" if end is None else f"ends at offset {end}"
            msg = (f"checkpoint {checkpoint} has read {topic} partition {partition} up to offset {offsets[partition]} "
                   f"(batch {batch}), but that partition {now}: the topic was deleted and recreated, or truncated. "
                   "Start the job with a new checkpoint directory (its safe point is seeded from the directives "
                   "topic; see the operator guide, Losing a checkpoint)")
            raise ConfigError(msg)


def check_checkpoint(spark: Any, settings: Settings, checkpoint: str) -> None:
    """Every start-time check, before the query starts."""
    from safepoint.connectors.kafka.topics import topic_ends

    check_layout(spark, settings, checkpoint)
    if settings.source_format != "kafka":  # the Python source finds a topic made again itself (a gap)
        return
    for topic in (settings.events_topic, settings.control_topic):
        newest = newest_offsets(spark, checkpoint, topic)
        if newest is not None:
            check_offsets(*newest, topic_ends(settings.librdkafka(), topic), topic, checkpoint)

"""The job driver's own figures: query active, last batch, input lag, messages by outcome.

``safepoint run`` feeds each new query progress to ``JobStatus.batch``; it keeps the totals, answers
``/healthz`` in the job's process, and publishes them to the status topic under ``%job`` so that
``safepoint serve`` shows the same metrics from the topics alone.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from safepoint.connectors.kafka.producer import ProducerSlot, is_fatal_exception
from safepoint.core.codec import encode
from safepoint.ops.status_store import JOB_KEY, StatusStore
from safepoint.streaming.job import gaps_in

__all__ = ["GAPS_SHOWN", "JobStatus", "input_lag"]

GAPS_SHOWN = 10
"""The newest gaps of the events topic the job's status shows (``/healthz``)."""

log = logging.getLogger(__name__)


def _offsets(raw: Any) -> dict[str, int]:
    """A source progress offset as {partition: offset}: the Python source's {"0": n} or Spark's
    connector's {"topic": {"0": n}} (both may come as JSON text)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    out: dict[str, int] = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            if isinstance(v, dict):
                out.update({f"{k}/{p}": int(o) for p, o in v.items() if isinstance(o, int)})
            elif isinstance(v, int):
                out[k] = v
    return out


def input_lag(progress: dict[str, Any]) -> int | None:
    """Messages between where the batch ended and the newest offsets (None if not reported)."""
    total, known = 0, False
    for src in progress.get("sources") or []:
        end, latest = _offsets(src.get("endOffset")), _offsets(src.get("latestOffset"))
        if latest:
            known = True
            total += sum(max(0, o - end.get(p, o)) for p, o in latest.items())
    return total if known else None


class JobStatus:
    def __init__(self, producer: ProducerSlot | None, topic: str, store: StatusStore | None = None) -> None:
        self.producer = producer
        """Made on first use and rebuilt after a fatal error (a broker restart can kill an idempotent producer)."""
        self.topic = topic
        self.failures = 0
        self.store = store
        self.record: dict[str, Any] = {"v": 1, "type": "job_status", "active": True, "batches": 0, "batch_id": None,
                                       "batch_duration_ms": None, "input_rows": 0, "input_lag_messages": None,
                                       "messages_total": {}, "gaps": [], "gaps_total": {},
                                       "wall_ms": int(time.time() * 1000)}
        self._gap_ids: set[int] = set()

    def batch(self, progress: dict[str, Any], counts: dict[str, int], rows: int) -> None:
        r = self.record
        r["batches"] += 1
        r["batch_id"] = progress.get("batchId")
        r["batch_duration_ms"] = (progress.get("durationMs") or {}).get("triggerExecution")
        r["input_rows"] = rows
        r["input_lag_messages"] = input_lag(progress)
        gaps = gaps_in(progress)
        if gaps:
            r["gaps"] = gaps[-GAPS_SHOWN:]
            for gap in gaps:
                if gap["id"] not in self._gap_ids:
                    self._gap_ids.add(gap["id"])
                    r["gaps_total"][gap["kind"]] = r["gaps_total"].get(gap["kind"], 0) + 1
        totals = r["messages_total"]
        for outcome in ("applied", "ignored", "deadlettered"):
            totals[outcome] = totals.get(outcome, 0) + counts.get(outcome, 0)
        self._publish()

    def stopped(self) -> None:
        self.record["active"] = False
        self._publish()

    def health(self, active: bool) -> dict[str, Any]:
        return {**self.record, "active": active}

    def _publish(self) -> None:
        self.record["wall_ms"] = int(time.time() * 1000)
        if self.store is not None:
            self.store.apply(JOB_KEY, dict(self.record))
        if self.producer is not None and self.topic:
            try:
                producer = self.producer.producer
                producer.produce(self.topic, key=JOB_KEY.encode(), value=encode(self.record).encode())
                producer.poll(0)
            except Exception as exc:  # the job's own figures are best effort: the job goes on
                self.failures += 1
                if is_fatal_exception(exc):
                    self.producer.rebuild()
                if self.failures in (1, 10, 100) or self.failures % 1000 == 0:
                    log.warning("publishing the job's status to %s failed (%d time(s)): %s", self.topic, self.failures, exc)

"""Prometheus metrics of the status: computed from the ``StatusStore`` at each scrape.

Names follow Prometheus conventions: the ``safepoint_`` prefix, base units (seconds, bytes; MVCC
timestamps and lags in the database's own unit), ``_total`` for counters, labels ``cluster``,
``node``, ``kind``, ``severity``, ``reason`` and ``outcome``, and one label value per hold only in
``safepoint_hold_pinned_bytes``, for the ``TOP_HOLDS`` costliest holds of each cluster (a bounded
series count). The metrics reference in docs/operations.md lists them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from safepoint.core.status import blocker_kinds
from safepoint.ops.status_store import StatusStore

__all__ = ["REASONS", "StatusCollector"]

REASONS = ("no_events", "discovery", "no_nodes", "missing_node", "unknown_node_min", "missing_group", "leaderless_group",
           "awaiting_snapshot", "control_lost")
"""Every reason kind a round can abort for (the label values of ``safepoint_round_aborted``)."""
TOP_HOLDS = 10
"""Holds per cluster ``safepoint_hold_pinned_bytes`` reports: the costliest ones."""


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class StatusCollector(Collector):
    def __init__(self, store: StatusStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:  # noqa: C901, PLR0912, PLR0915 - one flat list of families
        c = ["cluster"]
        safe = _gauge("safepoint_safe_ts", "The cluster's safe point (MVCC units); absent before the first directive", c)
        floor = _gauge("safepoint_catalog_floor", "The cluster's catalog floor (catalog version)", c)
        seq = _gauge("safepoint_directive_seq", "seq of the cluster's last compaction directive", c)
        wall = _gauge("safepoint_cluster_time_seconds", "The cluster's time (its nodes' newest wall_ms), Unix seconds", c)
        lag = _gauge("safepoint_lag", "Largest mvcc_now a node reported minus safe_ts (MVCC units)", c)
        age = _gauge("safepoint_blocker_age_seconds", "How long the hold at the safe point has been open (cluster time)", c)
        blocker_cost = _gauge("safepoint_blocker_pinned_bytes", "Bytes of history the hold at the safe point alone "
                              "keeps on its node (absent: its node sends no history curve)", c)
        hold_cost = _gauge("safepoint_hold_pinned_bytes", f"Bytes of history a hold alone keeps on its node, for the "
                           f"{TOP_HOLDS} costliest holds of each cluster", ["cluster", "node", "kind", "id"])
        aborted = _gauge("safepoint_round_aborted", "Reasons of this kind the cluster's round aborts for now (0: none)",
                         ["cluster", "reason"])
        holds = _gauge("safepoint_holds", "Holds of the cluster by kind (open readers and transactions, node floors)",
                       ["cluster", "kind"])
        alerts = _gauge("safepoint_alerts_active", "Active alerts by kind and severity (cluster alerts and node bands)",
                        ["cluster", "kind", "severity"])
        pinned = _gauge("safepoint_node_pinned_bytes", "Bytes of history the node reports pinned", ["cluster", "node"])
        growth = _gauge("safepoint_node_pinned_bytes_growth", "Growth of the node's pinned bytes, bytes per second, "
                        "fitted over forecast_window_ms", ["cluster", "node"])
        ttc = _gauge("safepoint_node_time_to_critical_seconds", "Projected time until the node's pinned bytes reach "
                     "the critical threshold at their growth rate (absent: not growing, or already critical)",
                     ["cluster", "node"])
        wrap = _gauge("safepoint_node_wraparound_left", "Transactions the node's engine may still assign before its "
                      "32-bit ids would wrap (a PostgreSQL agent: 2^31 - 1 minus the oldest age(datfrozenxid))",
                      ["cluster", "node"])
        history_len = _gauge("safepoint_node_history_length", "The engine's history not yet purged, in its own count, as "
                             "the node's last heartbeat said (a MariaDB agent: InnoDB's history list length)", ["cluster", "node"])
        purged = _gauge("safepoint_node_purged_ts", "The engine's own purge point, MVCC units (a MariaDB agent: InnoDB's "
                        "purge done below this transaction number)", ["cluster", "node"])
        stale = _gauge("safepoint_node_stale", "1 when the node's lease ran out (or it never reported)", ["cluster", "node"])
        paused_ = _gauge("safepoint_paused", "1 while the cluster is paused (no directive advances)", c)
        info = _gauge("safepoint_cluster_info", "1 per cluster, with what its MVCC timestamps count (its policy's "
                                                "mvcc_unit): every MVCC figure of the cluster is in that unit", ["cluster", "mvcc_unit"])
        gaps = _gauge("safepoint_gaps_open", "Gaps of the events and control topics (events lost before the job read them) the "
                                            "cluster has not closed: nodes still owe a snapshot, or it is unacknowledged", c)
        compacted = _gauge("safepoint_compacted_ts", "What the store itself has compacted (an etcd agent's compacted "
                           "revision, MVCC units): no service hold is taken below it", c)
        compactions = CounterMetricFamily("safepoint_compactions", "Times the store's compacted_ts rose since the job "
                                          "first saw it (an etcd agent's compactions)", labels=c)
        ns_safe = _gauge("safepoint_namespace_safe_ts", "Bound of a namespace without holds of its own (MVCC units)", c)
        ns_bound = _gauge("safepoint_namespace_bound", "Bound of a namespace with holds of its own (at most "
                          "max_namespaces per cluster)", ["cluster", "namespace"])
        throttled = CounterMetricFamily("safepoint_node_admission_throttled", "Long snapshots the node's admission "
                                        "control throttled (warning band) since its process started", labels=["cluster", "node"])
        refused = CounterMetricFamily("safepoint_node_admission_refused", "Long snapshots the node's admission control "
                                      "refused (critical band) since its process started", labels=["cluster", "node"])
        ignored = CounterMetricFamily("safepoint_control_ignored", "Control events that changed nothing, by reason",
                                      labels=["cluster", "reason"])
        for st in self.store.all():
            name = st["cluster"]
            if st.get("safe_ts") is not None:
                safe.add_metric([name], st["safe_ts"])
            if st.get("catalog_floor") is not None:
                floor.add_metric([name], st["catalog_floor"])
            seq.add_metric([name], st.get("seq") or 0)
            if st.get("cluster_wall_ms") is not None:
                wall.add_metric([name], st["cluster_wall_ms"] / 1000)
            if st.get("lag") is not None:
                lag.add_metric([name], st["lag"])
            blocker = st.get("blocker") or {}
            if blocker.get("age_ms") is not None:
                age.add_metric([name], blocker["age_ms"] / 1000)
            if blocker.get("cost_bytes") is not None:
                blocker_cost.add_metric([name], blocker["cost_bytes"])
            costed = sorted((h for h in st["holds"] if h.get("cost_bytes")), key=lambda h: -h["cost_bytes"])
            for h in costed[:TOP_HOLDS]:
                hold_cost.add_metric([name, h["node"] or "", h["kind"], h["id"] or ""], h["cost_bytes"])
            reasons = st["round"].get("reason_counts")  # every reason, when the list is cut at 100
            if reasons is None:
                reasons = {k: [r["kind"] for r in st["round"]["reasons"]].count(k) for k in REASONS}
            for kind in REASONS:
                aborted.add_metric([name, kind], reasons.get(kind, 0))
            for kind in blocker_kinds():
                holds.add_metric([name, kind], st["hold_counts"].get(kind, 0))
            active: dict[tuple[str, str], int] = {}
            if "alert_counts" in st:  # every active alert, when the list is cut at 100
                for ks, n in st["alert_counts"].items():
                    kind, _, severity = ks.rpartition("/")
                    active[(kind, severity)] = n
            else:
                for a in st.get("alerts", []):
                    k = (a["kind"], a.get("severity") or "warning")
                    active[k] = active.get(k, 0) + 1
            for n in st["nodes"]:
                for band, kind in (("pinned", "pinned_bytes"), ("age", "reader_age")):
                    level = (n.get("bands") or {}).get(band, "normal")
                    if level != "normal":
                        active[(kind, level)] = active.get((kind, level), 0) + 1
                if n.get("in_doubt"):
                    active[("in_doubt_tx", "warning")] = active.get(("in_doubt_tx", "warning"), 0) + len(n["in_doubt"])
                if n.get("pinned_bytes") is not None:
                    pinned.add_metric([name, n["node"]], n["pinned_bytes"])
                if n.get("wraparound_left") is not None:
                    wrap.add_metric([name, n["node"]], n["wraparound_left"])
                if n.get("history_length") is not None:
                    history_len.add_metric([name, n["node"]], n["history_length"])
                if n.get("purged_ts") is not None:
                    purged.add_metric([name, n["node"]], n["purged_ts"])
                admission = n.get("admission")
                if admission:
                    throttled.add_metric([name, n["node"]], admission["throttled"])
                    refused.add_metric([name, n["node"]], admission["refused"])
                forecast = n.get("forecast") or {}
                if forecast.get("pinned_bytes_per_s") is not None:
                    growth.add_metric([name, n["node"]], forecast["pinned_bytes_per_s"])
                if forecast.get("time_to_critical_s") is not None:
                    ttc.add_metric([name, n["node"]], forecast["time_to_critical_s"])
                if forecast.get("forecast_raised"):
                    active[("pressure_forecast", "warning")] = active.get(("pressure_forecast", "warning"), 0) + 1
                stale.add_metric([name, n["node"]], 1 if n.get("stale") else 0)
            for (kind, severity), count in sorted(active.items()):
                alerts.add_metric([name, kind, severity], count)
            paused_.add_metric([name], 1 if st.get("paused") else 0)
            gaps.add_metric([name], len(st.get("gaps") or []))
            info.add_metric([name, str(st.get("mvcc_unit") or "none")], 1)
            if st.get("compacted_ts") is not None:
                compacted.add_metric([name], st["compacted_ts"])
                compactions.add_metric([name], st["compactions"])
            if st.get("namespace_safe_ts") is not None:
                ns_safe.add_metric([name], st["namespace_safe_ts"])
            for ns, b in sorted((st.get("namespaces") or {}).items()):
                ns_bound.add_metric([name, ns], b)
            for reason, n in sorted((st.get("control_ignored") or {}).items()):
                ignored.add_metric([name, reason], n)
        yield from (safe, floor, seq, wall, lag, age, blocker_cost, hold_cost, aborted, holds, alerts, pinned, growth, ttc, throttled, refused, wrap, stale,
                    paused_, gaps, info, ignored, compacted, compactions, ns_safe, ns_bound)
        yield from self._job(self.store.job)

    def _job(self, job: dict[str, Any] | None) -> Iterator[Metric]:
        messages = CounterMetricFamily("safepoint_input_messages", "Input messages by outcome since the job started",
                                       labels=["outcome"])
        batch = _gauge("safepoint_batch_duration_seconds", "Duration of the job's last micro-batch", [])
        lag = _gauge("safepoint_input_lag_messages", "Messages of the events topic not yet read by the job", [])
        active = _gauge("safepoint_query_active", "1 while the job's streaming query runs", [])
        batches = CounterMetricFamily("safepoint_batches", "Micro-batches the job finished since it started", labels=[])
        reported = _gauge("safepoint_job_report_time_seconds", "When the job last reported its figures (after every "
                          "micro-batch), as Unix seconds of its clock", [])
        found = CounterMetricFamily("safepoint_events_topic_gaps", "Gaps the job found in the events and control topics since it "
                                    "started (events lost before it read them), by kind", labels=["kind"])
        if job is not None:
            for kind, n in sorted((job.get("gaps_total") or {}).items()):
                found.add_metric([kind], n)
            for outcome, n in sorted((job.get("messages_total") or {}).items()):
                messages.add_metric([outcome], n)
            if job.get("batch_duration_ms") is not None:
                batch.add_metric([], job["batch_duration_ms"] / 1000)
            if job.get("input_lag_messages") is not None:
                lag.add_metric([], job["input_lag_messages"])
            active.add_metric([], 1 if job.get("active") else 0)
            batches.add_metric([], job.get("batches", 0))
            if job.get("wall_ms") is not None:
                reported.add_metric([], job["wall_ms"] / 1000)
        yield from (messages, batch, lag, active, batches, reported, found)

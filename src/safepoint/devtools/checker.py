"""An independent checker of a whole run: the events topic in, the directives, alerts and dead
letters out, and the contract's safety, order, liveness and accounting rules between them.

It never imports ``safepoint.core``: its model of a node (readers, transactions, restarts,
snapshots, duplicates) and its validation of a message are written again here, as simply as
possible, from docs/contract.md. A bug shared by the job and this module would have to be made twice.

Safety. A compaction directive carries ``positions``: for every events partition, the offset
after the cluster's last message the job had applied when it emitted the directive. A node's
events share a Kafka key, so they sit in one partition in order, and the node's state there is a
pure function of the log: when this checker, reading a partition in offset order, reaches a
directive's position in it, every node of the cluster in that partition is where the job had it,
and the directive's ``safe_ts`` must be <= every hold live there (reader ``read_ts``, transaction
``begin_ts`` prepared or not, a group's published min tx time, ``mvcc_now - retention``). A hold
below ``safe_ts`` is excused only if it was already below the previous directive's ``safe_ts``
(it arrived late: nothing could protect it any more) and a ``horizon_violation`` alert names it.
By induction over the directives this catches every directive that passed a hold it had counted.
A directive of an older job without ``positions`` names every member's (incarnation, seq) in its
``basis`` instead, and is checked at those positions. ``members`` records (a cluster's member set)
are counted.

Liveness. The lag is ``cluster_wall_ms * mvcc_per_ms - safe_ts``; its worst value is just before
an advance (``cluster_wall_ms`` of directive k against ``safe_ts`` of k-1) or at the end of the
log. After the warm-up it must stay under ``retention + (longest hold lifetime seen in the log +
node_lease_ms + directive_interval_ms) * mvcc_per_ms``.

Accounting. Every message is applied, ignored (a duplicate or stale one) or dead-lettered; this
checker classifies each itself and matches its bad ones with the job's dead letters by
(partition, offset), both ways.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from safepoint.core.ids import join_id
from safepoint.devtools.check_result import CheckResult
from safepoint.ops.contract_check import CLUSTER_TYPES, CONTROL_TYPES, INT64_MIN, SnapshotParts, is_int, validate_event

__all__ = ["CheckResult", "check_logs", "validate_event"]


# -- the model of one node ------------------------------------------------------------------


@dataclass
class _Hold:
    ts: int
    opened_wall: int
    prepared: bool = False
    incarnation: int = 0
    """The process that opened it."""


@dataclass
class _Node:
    incarnation: int = -1
    seq: int = -1
    holds: dict[tuple[str, str], _Hold] = field(default_factory=dict)
    """(kind, id) -> hold; an older incarnation's under ``id@incarnation`` (as the job names them)."""
    mvcc_now: int | None = None
    groups: dict[str, tuple[bool, int | None]] = field(default_factory=dict)
    last_wall: int = -1
    others: dict[int, list[Any]] = field(default_factory=dict)
    """Incarnations besides the newest whose holds are kept: inc -> [last seq, last log time, spoke after a
    newer one, the wall_ms of the newer one's first event (None: not known)]."""
    gone: dict[int, list[Any]] = field(default_factory=dict)
    """Incarnations whose holds went: inc -> [last seq, the wall_ms of the newer one's first event] (the newest four)."""
    unsure: bool = False
    """Events of it were in offsets this checker never read (deleted first): not checked until its snapshot."""
    parts: SnapshotParts = field(default_factory=SnapshotParts)


class _Checker:
    def __init__(
        self,
        directives: list[dict[str, Any]],
        alerts: list[dict[str, Any]],
        retention: int,
        result: CheckResult,
        node_lease_ms: int = 30_000,
        incarnation_grace_ms: int = 5_000,
    ) -> None:
        self.r = result
        self.retention = retention
        self.lease = node_lease_ms
        self.grace = incarnation_grace_ms
        self.nodes: dict[tuple[str, str], _Node] = {}
        self.topologies: dict[str, dict[int, frozenset[str]]] = defaultdict(dict)
        self.cluster_first: dict[str, int] = {}
        self.cluster_last: dict[str, int] = {}
        self.versions: dict[tuple[str, str], int] = {}
        self.late_alert_ids: set[str] = set()
        self.late_alert_ts: set[tuple[str, str, int]] = set()
        self._alerts(alerts)
        self.by_cluster = self._directives(directives)
        # (cluster, node) -> (incarnation, seq) -> [(directive, previous safe_ts)]
        self.at: dict[tuple[str, str], dict[tuple[int, int], list[tuple[dict[str, Any], int | None]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        # (partition, offset) -> [(cluster, directive, previous safe_ts)]: checked when the partition reaches it
        self.at_offset: dict[tuple[int, int], list[tuple[str, dict[str, Any], int | None]]] = defaultdict(list)
        self.in_partition: dict[tuple[str, int], set[str]] = defaultdict(set)
        """(cluster, partition) -> the nodes whose events are there."""
        self.read_to: dict[int, int] = {}
        """partition -> the offset after the last message read."""
        self.pending = 0
        for cluster, ds in self.by_cluster.items():
            prev: int | None = None
            for d in ds:
                if "positions" in d:
                    for part, offset in d["positions"].items():
                        if not part.isdigit():
                            continue  # the control topic's ("control:0"): this checker reads the events topic
                        self.at_offset[(int(part), offset)].append((cluster, d, prev))
                        self.pending += 1
                else:  # an older job's directive: every member at its own (incarnation, seq)
                    for node, b in (d.get("basis") or {}).items():
                        self.at[(cluster, node)][(b["incarnation"], b["seq"])].append((d, prev))
                        self.pending += 1
                prev = d["safe_ts"]

    def _alerts(self, alerts: list[dict[str, Any]]) -> None:
        seen: set[str] = set()
        for a in alerts:
            text = json.dumps(a, sort_keys=True)
            if text in seen:
                continue  # the sink is at-least-once: a replayed batch sends the same alert again
            seen.add(text)
            kind = str(a.get("kind"))
            (self.r.alerts_raised if a.get("state") == "raised" else self.r.alerts_cleared)[kind] += 1
            if kind == "horizon_violation" and a.get("state") == "raised":
                self.late_alert_ids.add(str(a.get("id")))
                if is_int(a.get("value")):
                    self.late_alert_ts.add((str(a.get("cluster")), str(a.get("node")), a["value"]))

    def _directives(self, directives: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        by_cluster: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        for d in directives:
            if d.get("type") == "expire":
                self.r.expire_directives += 1
                continue
            if d.get("type") == "snapshot_request":
                self.r.snapshot_requests += 1
                continue
            if d.get("type") == "members":
                self.r.members_records += 1
                continue
            if d.get("type") == "band":
                continue  # a node's pinned band, for its admission control: no safety content
            if d.get("type") != "compaction":
                self.r.violation(f"unknown directive type {d.get('type')!r}", order=True)
                continue
            cluster, seq = d["cluster"], d["seq"]
            old = by_cluster[cluster].get(seq)
            if old is not None:
                if old != d:
                    self.r.violation(f"cluster {cluster}: two different directives with seq {seq}", order=True)
                self.r.directive_duplicates += 1
                continue
            by_cluster[cluster][seq] = d
        out: dict[str, list[dict[str, Any]]] = {}
        for cluster, seqs in by_cluster.items():
            ds = [seqs[s] for s in sorted(seqs)]
            self.r.directives += len(ds)
            if ds and ds[0]["seq"] != 1:
                self.r.violation(f"cluster {cluster}: the first directive has seq {ds[0]['seq']}, not 1", order=True)
            for a, b in zip(ds, ds[1:], strict=False):
                if b["seq"] != a["seq"] + 1:
                    self.r.violation(f"cluster {cluster}: directive seq jumps from {a['seq']} to {b['seq']}", order=True)
                if b["safe_ts"] < a["safe_ts"]:
                    self.r.violation(
                        f"cluster {cluster}: safe_ts went back from {a['safe_ts']} (seq {a['seq']}) to {b['safe_ts']}", order=True
                    )
                if a.get("catalog_floor") is not None and (b.get("catalog_floor") is None or b["catalog_floor"] < a["catalog_floor"]):
                    self.r.violation(f"cluster {cluster}: catalog_floor went back at seq {b['seq']}", order=True)
            out[cluster] = ds
        return out

    # -- the log ------------------------------------------------------------------------
    def reached(self, partition: int, offset: int) -> None:
        """The partition is read up to ``offset`` (the next message, or its end): check the
        directives whose position in it is that offset, on every node of theirs there."""
        for cluster, d, prev in self.at_offset.pop((partition, offset), ()):
            self.pending -= 1
            for name in sorted(self.in_partition.get((cluster, partition), ())):
                self._check(cluster, name, self.nodes[(cluster, name)], d, prev)

    def message(self, partition: int, offset: int, value: bytes | str | None, broker_ms: int | None = None) -> bool:
        """Classify and apply one message (``broker_ms``: its record's broker time, if the topic is
        stamped by the broker). Returns False when it is bad (a dead letter is due)."""
        self.reached(partition, offset)
        if offset > self.read_to.get(partition, 0):  # offsets skipped: records deleted before they were read
            for (_cluster, p), names in self.in_partition.items():
                if p == partition:
                    for name in names:
                        self.nodes[(_cluster, name)].unsure = True
        self.read_to[partition] = offset + 1
        self.r.messages += 1
        ev, why = validate_event(value)
        if ev is None:
            self.r.bad += 1
            self.r.bad_reasons[str(why)] += 1
            return False
        cluster = ev.get("cluster", "default")
        if ev["type"] in CONTROL_TYPES:
            self.r.applied += 1  # in log order, never ignored as stale (a repeated action changes nothing)
            return True
        if ev["type"] in CLUSTER_TYPES:
            self._cluster_event(cluster, ev)
            return True
        key = (cluster, ev["node"])
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = _Node()
        self.in_partition[(cluster, partition)].add(ev["node"])
        if not self._apply(node, ev, ev["wall_ms"] if broker_ms is None else broker_ms):
            self.r.ignored += 1
            return True
        self.r.applied += 1
        wall = ev["wall_ms"]
        self.cluster_first[cluster] = min(self.cluster_first.get(cluster, wall), wall)
        self.cluster_last[cluster] = max(self.cluster_last.get(cluster, wall), wall)
        checks = self.at.get(key, {}).pop((node.incarnation, node.seq), None)
        for d, prev in checks or []:
            self.pending -= 1
            self._check(cluster, ev["node"], node, d, prev)
        return True

    def _cluster_event(self, cluster: str, ev: dict[str, Any]) -> None:
        key = (cluster, ev["type"])
        if ev["version"] <= self.versions.get(key, -1):
            self.r.ignored += 1  # stale version
            return
        self.versions[key] = ev["version"]
        self.r.applied += 1
        if ev["type"] == "topology":
            self.topologies[cluster][ev["version"]] = frozenset(ev["nodes"])

    def _close(self, node: _Node, key: tuple[str, str], wall: int) -> None:
        hold = node.holds.pop(key, None)
        if hold is not None:
            self.r.longest_hold_ms = max(self.r.longest_hold_ms, wall - hold.opened_wall)

    def _apply(self, node: _Node, ev: dict[str, Any], log: int) -> bool:
        """One node event at log time ``log``. A newer incarnation does not prove the older process
        dead: its readers and unprepared transactions stay (as ``id@incarnation``) until it has been
        silent for the grace after the newer one appeared, or for a lease once it spoke after that
        (two live processes, whose every event counts); prepared transactions stay until decided."""
        older = self._process(node, ev, log)
        if older is None:
            return False  # stale or duplicate: ignored
        whole = node.parts.take(ev)
        if whole is None:
            self._silent(node, log, ev["wall_ms"])
            return True  # a part of a snapshot sent in several messages: applied with its last
        ev = whole
        inc, wall = ev["incarnation"], ev["wall_ms"]

        def key(kind: str, hid: str) -> tuple[str, str]:
            if not older:
                return (kind, hid)
            own = node.holds.get((kind, hid))
            if (kind, f"{hid}@{inc}") not in node.holds and own is not None and own.incarnation == inc:
                return (kind, hid)  # its prepared transaction, which the newer process took over
            return (kind, f"{hid}@{inc}")

        node.last_wall = max(node.last_wall, wall)
        t = ev["type"]
        if t in ("reader_open", "tx_begin"):
            k = key(*(("reader", ev["reader_id"]) if t == "reader_open" else ("tx", ev["tx_id"])))
            self._close(node, k, wall)
            node.holds[k] = _Hold(ev["read_ts"] if t == "reader_open" else ev["begin_ts"], wall, incarnation=inc)
        elif t in ("reader_close", "tx_end"):
            self._close(node, key(*(("reader", ev["reader_id"]) if t == "reader_close" else ("tx", ev["tx_id"]))), wall)
        elif t == "tx_prepare":
            hold = node.holds.get(key("tx", ev["tx_id"]))
            if hold is not None:
                hold.prepared = True
        elif t == "heartbeat":
            node.mvcc_now = ev["mvcc_now"]
            if "groups" in ev:
                node.groups = {g["group"]: (bool(g.get("leader", False)), g.get("published_min_tx_time")) for g in ev["groups"]}
        elif t == "snapshot":
            self._snapshot(node, ev, older, wall)
            node.unsure = False
        self._silent(node, log, wall)
        return True

    def _process(self, node: _Node, ev: dict[str, Any], log: int) -> bool | None:
        """Which process speaks: None for a stale or repeated message, True for an older incarnation's
        next message (a second live process), False for the newest's (a newer one supersedes it)."""
        inc, seq = ev["incarnation"], ev["seq"]
        if inc < node.incarnation:
            entry = node.others.get(inc)
            last, since = (entry[0], entry[3]) if entry is not None else node.gone.get(inc, (None, None))
            if last is None or seq <= last:
                return None
            if since is not None and ev["wall_ms"] <= since:  # sent before the newer process started: late
                if entry is None:
                    return None  # its holds went already
                entry[0] = seq
                return True
            if entry is None:
                entry = node.others[inc] = [seq, log, True, since]
                node.gone.pop(inc)
            entry[0], entry[1], entry[2] = seq, max(entry[1], log), True
            if node.incarnation not in node.others and node.incarnation not in node.gone:
                node.others[node.incarnation] = [node.seq, log, True, None]
            return True
        if inc == node.incarnation and seq <= node.seq:
            return None
        if inc > node.incarnation:
            if node.incarnation >= 0:  # superseded: its holds wait for its silence
                old = node.incarnation
                node.others[old] = [node.seq, log, False, ev["wall_ms"]]
                for k in [k for k, h in node.holds.items() if h.incarnation == old and not h.prepared]:
                    node.holds[(k[0], f"{k[1]}@{old}")] = node.holds.pop(k)
            node.incarnation = inc
        elif inc in node.gone and inc not in node.others:  # its holds went, and it speaks again
            node.others[inc] = [seq, log, True, node.gone.pop(inc)[1]]
        node.seq = seq
        if inc in node.others:
            node.others[inc][0] = seq
            node.others[inc][1] = max(node.others[inc][1], log)
        return False

    def _snapshot(self, node: _Node, ev: dict[str, Any], older: bool, wall: int) -> None:
        """The sending process's complete active set replaces that process's holds (a hold kept with
        its ts stays the same hold); the other incarnations' stay."""
        inc = ev["incarnation"]

        def its(k: tuple[str, str], h: _Hold) -> bool:
            theirs = h.incarnation != node.incarnation and k[1].endswith(f"@{h.incarnation}")
            return (theirs and h.incarnation == inc) if older else not theirs

        mine = {k: h for k, h in node.holds.items() if its(k, h)}
        new: dict[tuple[str, str], _Hold] = {}
        for kind, items, id_key, ts_key in (("reader", ev["readers"], "reader_id", "read_ts"), ("tx", ev["txs"], "tx_id", "begin_ts")):
            for item in items:
                k = (kind, item[id_key] if not older else f"{item[id_key]}@{inc}")
                old_hold = mine.get(k)
                if old_hold is not None and old_hold.ts == item[ts_key]:
                    new[k] = _Hold(old_hold.ts, old_hold.opened_wall, bool(item.get("prepared", old_hold.prepared)),
                                   old_hold.incarnation)
                else:
                    new[k] = _Hold(item[ts_key], wall, bool(item.get("prepared", False)), inc)
        for k, old_hold in mine.items():
            if k not in new or new[k].ts != old_hold.ts:
                self._close(node, k, wall)
        node.holds = {**new, **{k: h for k, h in node.holds.items() if k not in mine}}

    def _silent(self, node: _Node, log: int, wall: int) -> None:
        """Drop the holds of the incarnations silent too long (prepared ones stay, under their own id)."""
        due = []
        for inc, (_seq, last, spoke, _since) in sorted(node.others.items()):
            if inc == node.incarnation and not spoke:
                continue
            if log - last >= (self.lease if spoke else self.grace):
                due.append(inc)
        alive = sorted(k for k in node.others if k != node.incarnation and k not in due)
        due = sorted(set(due) | set(alive[:max(0, len(alive) - 4)]))
        for inc in due:
            for k in [k for k, h in node.holds.items() if h.incarnation == inc]:
                hold = node.holds[k]
                if not hold.prepared:
                    self._close(node, k, wall)
                elif inc != node.incarnation and k[1].endswith(f"@{inc}") and (k[0], k[1][: -len(f"@{inc}")]) not in node.holds:
                    node.holds[(k[0], k[1][: -len(f"@{inc}")])] = node.holds.pop(k)
            dropped = node.others.pop(inc)
            node.gone[inc] = [dropped[0], dropped[3]]
            for old in sorted(node.gone)[:max(0, len(node.gone) - 4)]:
                del node.gone[old]
        if set(node.others) <= {node.incarnation}:
            node.others.clear()

    def _check(self, cluster: str, name: str, node: _Node, d: dict[str, Any], prev: int | None) -> None:
        """Directive ``d`` was emitted with ``node`` at this very position: its holds bound safe_ts."""
        r = self.r
        if node.unsure:
            r.unsure_checks += 1
            return
        r.basis_checked += 1
        safe = d["safe_ts"]
        where = f"directive seq {d['seq']} (safe_ts {safe}) of cluster {cluster}, node {name} at incarnation {node.incarnation} seq {node.seq}"
        if node.mvcc_now is None:
            r.violation(f"{where}: the node never sent a heartbeat, its minimum is unknown")
            return
        bounds: list[tuple[str, int]] = [("retention", max(node.mvcc_now - self.retention, INT64_MIN))]
        for gid, (leader, published) in node.groups.items():
            if published is None:
                if leader:
                    r.violation(f"{where}: group {gid} it leads has no published min tx time (minimum unknown)")
                    return
                continue
            bounds.append((f"group {gid}", published))
        local_min = min(ts for _, ts in bounds)
        for what, ts in bounds:
            if ts >= safe:
                continue
            if prev is not None and ts < prev:
                r.excused_late_holds += 1  # it went below an older safe_ts (no alert exists for these)
                r.note(f"{where}: the {what} bound {ts} is below the previous safe_ts {prev}")
            else:
                r.violation(f"{where}: passed the {what} bound {ts}")
        for (kind, hid), hold in sorted(node.holds.items()):
            r.holds_checked += 1
            local_min = min(local_min, hold.ts)
            if hold.ts >= safe:
                continue
            if prev is not None and hold.ts < prev:
                if join_id(cluster, "horizon_violation", name, kind, hid) in self.late_alert_ids or (cluster, name, hold.ts) in self.late_alert_ts:
                    r.excused_late_holds += 1
                else:
                    r.violation(f"{where}: {kind} {hid} at {hold.ts} arrived below safe_ts {prev} with no horizon_violation alert")
                continue
            r.violation(f"{where}: passed live {kind} {hid} at {hold.ts}" + (" (prepared)" if hold.prepared else ""))
        listed = d.get("basis") or {}
        if "positions" in d and name not in listed:
            return  # the basis lists only the lowest minimums
        reported = listed.get(name, {}).get("local_min")
        if reported != local_min:
            r.basis_min_mismatches += 1
            if r.basis_min_mismatches <= 3:
                r.note(f"{where}: basis local_min {reported}, this checker's {local_min}")

    def finish(self, mvcc_per_ms: int, node_lease_ms: int, directive_interval_ms: int, warmup_ms: int) -> None:
        r = self.r
        for partition, stop in self.read_to.items():
            self.reached(partition, stop)  # positions at a partition's end
        r.basis_unverified = self.pending
        if self.pending:
            left: list[Any] = [(k, pos) for k, positions in self.at.items() for pos in positions]
            left += list(self.at_offset)
            r.violation(
                f"{self.pending} basis positions name events this checker never applied, e.g. {left[:3]}: "
                "those directives cannot be verified"
            )
        for (cluster, _name), node in self.nodes.items():
            end = self.cluster_last.get(cluster)
            if end is not None:
                for hold in node.holds.values():
                    r.longest_hold_ms = max(r.longest_hold_ms, end - hold.opened_wall)
        for cluster, ds in self.by_cluster.items():
            tops = set(self.topologies.get(cluster, {}).values())
            if tops:  # the members a directive counts are a topology's nodes (the basis lists the lowest of them)
                r.basis_not_topology += sum(
                    1 for d in ds if not any(frozenset(d.get("basis") or {}) <= t and d.get("members", len(t)) == len(t)
                                             and ("members" in d or frozenset(d.get("basis") or {}) == t) for t in tops))
        if self.cluster_first:
            r.first_wall_ms = min(self.cluster_first.values())
            r.last_wall_ms = max(self.cluster_last.values())
        r.lag_bound = self.retention + (r.longest_hold_ms + node_lease_ms + directive_interval_ms) * mvcc_per_ms
        for cluster in sorted(set(self.cluster_first) | set(self.by_cluster)):
            ds = self.by_cluster.get(cluster, [])
            first, last = self.cluster_first.get(cluster), self.cluster_last.get(cluster)
            lags: list[int] = []
            if first is not None and last is not None:
                warm = first + warmup_ms
                for a, b in zip(ds, ds[1:], strict=False):
                    if b["cluster_wall_ms"] >= warm:
                        lags.append(b["cluster_wall_ms"] * mvcc_per_ms - a["safe_ts"])
                if ds and last >= warm:
                    lags.append(last * mvcc_per_ms - ds[-1]["safe_ts"])
                elif not ds and last >= warm:
                    lags.append((last - first) * mvcc_per_ms)  # no directive at all: the lag is the whole run
            worst = max(lags) if lags else None
            r.lag_samples += len(lags)
            if worst is not None:
                r.max_lag = worst if r.max_lag is None else max(r.max_lag, worst)
            r.clusters[cluster] = {
                "directives": len(ds),
                "final_safe_ts": ds[-1]["safe_ts"] if ds else None,
                "first_wall_ms": first,
                "last_wall_ms": last,
                "max_lag": worst,
                "final_lag": last * mvcc_per_ms - ds[-1]["safe_ts"] if ds and last is not None else None,
            }


def check_logs(
    events: Iterable[tuple[Any, ...]],
    directives: list[dict[str, Any]],
    alerts: list[dict[str, Any]],
    dead_letters: list[dict[str, Any]],
    *,
    events_topic: str = "safepoint.events",
    retention: int = 0,
    node_lease_ms: int = 30_000,
    directive_interval_ms: int = 0,
    warmup_ms: int = 0,
    mvcc_per_ms: int = 1000,
    incarnation_grace_ms: int = 5_000,
) -> CheckResult:
    """Check a whole run. ``events`` are (partition, offset, value[, broker time]) in offset order per
    partition (partitions may come one after another); the output lists are the topics' parsed values."""
    result = CheckResult()
    checker = _Checker(directives, alerts, retention, result, node_lease_ms, incarnation_grace_ms)
    dl_at: set[tuple[int, int]] = set()
    for dl in dead_letters:
        if dl.get("topic", events_topic) != events_topic:
            continue
        pos = (dl["partition"], dl["offset"])
        if pos in dl_at:
            result.dead_letter_duplicates += 1
        dl_at.add(pos)
    result.dead_letters = len(dl_at)
    for partition, offset, value, *broker in events:
        ok = checker.message(partition, offset, value, broker[0] if broker else None)
        if ok and (partition, offset) in dl_at:
            result.dead_letters_unexpected += 1
            if result.dead_letters_unexpected <= 3:
                result.note(f"the job dead-lettered {partition}:{offset}, which this checker applies: {_show(value)}")
        elif not ok and (partition, offset) not in dl_at:
            result.dead_letters_missing += 1
            if result.dead_letters_missing <= 3:
                result.note(f"no dead letter for bad message {partition}:{offset}: {_show(value)}")
    checker.finish(mvcc_per_ms, node_lease_ms, directive_interval_ms, warmup_ms)
    return result


def _show(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        try:
            return repr(value.decode("utf-8"))[:160]
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode("ascii")[:160]
    return repr(value)[:160]


# -- reading the topics back ----------------------------------------------------------------

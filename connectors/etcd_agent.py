"""``safepoint agent etcd``: safepoint drives a real etcd cluster's compaction.

One agent per etcd cluster. It is one node of the safepoint cluster it serves:

* **It reports.** Every heartbeat interval it reads the store (any member: the current revision;
  every member: ``dbSize`` and ``dbSizeInUse``; the compacted revision) and publishes a heartbeat
  with ``mvcc_now`` = the current revision, ``pinned_bytes`` = the largest ``dbSizeInUse`` of a
  member (live keys and the history not compacted yet), ``debt_bytes`` = the largest free space of
  a member (``dbSize - dbSizeInUse``: what compaction freed and only a defragmentation gives back)
  and ``compacted_ts`` = the compacted revision (the job refuses a service hold below it). While no
  member answers it publishes nothing: the job sees the node go stale and holds the safe point.
* **It compacts.** It follows the cluster's compaction directives and calls etcd's ``Compact`` at
  the newest directive's ``safe_ts`` (``Compactor``): never above it (nor above the current
  revision), never at or below what is compacted already, at most once per ``compact_every_s``,
  and only from a directive newer than the last it acted on (a stale or repeated directive does
  nothing; with ``state_dir`` that survives its own restart too). The readers it protects are the
  cluster's service holds: ``safepoint hold set C H --ts REV``, or ``connectors/etcd_holds.py``.
* **It refuses a second compactor.** etcd's own ``--auto-compaction-retention`` compacts by time or
  by revisions whatever is held: the agent will not start while a member runs with it, unless
  ``allow_auto_compaction`` (a held revision may then be compacted under its reader). A
  compacted revision that rises past the agent's own compaction is logged as an error and counted
  (``foreign_compactions``): somebody else compacts this cluster.
* **Optionally it defragments** (``defrag_free_bytes``, off by default): after a compaction, one
  member whose free space is at least that large, followers before the leader, at most one member
  per compaction interval (a defragmentation blocks that member's reads and writes meanwhile).

It survives an etcd member's or leader's restart (the gateway tries the other members), every
member away (heartbeats stop, retried with back-off, and resume), a broker outage (the reporter and
the listener reconnect) and its own restart (a new incarnation; the listener's backlog delivers
only the newest directive, whose ``safe_ts`` is at or below what is compacted already).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from safepoint.connectors.directive_models import Directive
from safepoint.connectors.etcd_gateway import EtcdError, EtcdGateway, EtcdUnavailable, MemberStatus, RevisionCompacted
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import DEFAULT_EVENTS_TOPIC, Reporter
from safepoint.errors import SafepointError

__all__ = ["AgentStats", "AutoCompactionOn", "Compactor", "EtcdAgent"]

log = logging.getLogger("safepoint.agent.etcd")

STATE_FILE = "etcd-agent.json"
MAX_BACKOFF_S = 10.0


class AutoCompactionOn(SafepointError):
    """A member of the etcd cluster compacts by itself (``--auto-compaction-retention``)."""


@dataclass
class AgentStats:
    compactions: int = 0
    """Compactions the agent made."""
    compacted: int = 0
    """The store's compacted revision, as last seen."""
    directive_seq: int = 0
    """The newest directive's seq the agent took."""
    stale_directives: int = 0
    """Directives at or below the newest seq taken (repeats, replays, an older job's)."""
    foreign_compactions: int = 0
    """Times the compacted revision rose past the agent's own compactions."""
    defragmentations: int = 0
    heartbeats: int = 0
    etcd_failures: int = 0
    """Reads of the store or calls of Compact that failed (no member answered, or etcd refused)."""


@dataclass
class Compactor:
    """What the agent compacts, and when: the rules as a pure object (no etcd, no Kafka)."""

    interval_s: float
    seq: int = 0
    """The seq of the newest directive taken."""
    target: int | None = None
    """That directive's safe_ts: the revision to compact at, once it lies above ``compacted``."""
    compacted: int = 0
    """What the store has compacted (etcd's compacted revision; 0: never)."""
    last_at: float | None = None
    """When the last compaction was made (the agent's monotonic clock)."""
    stats: AgentStats = field(default_factory=AgentStats)
    read: bool = False
    """The store's compacted revision was read once (what it was at the start is nobody's fault)."""
    generation: str | None = None
    """The job's generation of the newest directive taken (None: none, or a job that gives none)."""

    def take(self, seq: int, safe_ts: int, generation: str | None = None) -> bool:
        """A directive: True when it is newer than every one taken (its ``safe_ts`` becomes the target).
        One of another generation (the job started on empty state and numbers from 1 again) is newer
        unless its ``safe_ts`` lies below what the store has compacted (the agent never goes back) or it
        has no generation (a job of a version without them: older than the one the agent follows)."""
        if generation != self.generation and self.seq:
            if generation is None or safe_ts < self.compacted:  # an older version's job, or below: never back
                self.stats.stale_directives += 1
                return False
            log.warning("etcd agent: the job's generation changed (%s -> %s); taking its directives from seq %d",
                        self.generation, generation, seq)
        elif seq <= self.seq:
            self.stats.stale_directives += 1
            return False
        self.generation = generation
        self.seq = seq
        self.stats.directive_seq = seq
        self.target = safe_ts
        return True

    def due(self, now: float, current: int) -> int | None:
        """The revision to compact at now, or None: the target, never above the current revision,
        only above what is compacted, and not before ``interval_s`` after the last compaction."""
        if self.target is None:
            return None
        revision = min(self.target, current)
        if revision <= self.compacted:
            return None
        if self.last_at is not None and now - self.last_at < self.interval_s:
            return None
        return revision

    def done(self, revision: int, now: float) -> None:
        self.compacted = max(self.compacted, revision)
        self.last_at = now
        self.stats.compactions += 1
        self.stats.compacted = self.compacted

    def seen(self, compacted: int) -> bool:
        """The store's compacted revision as read: True when it rose past the agent's own compactions
        after the first reading (somebody else compacts the cluster)."""
        foreign = self.read and compacted > self.compacted
        self.read = True
        if foreign:
            self.stats.foreign_compactions += 1
        if compacted > self.compacted:
            self.compacted = compacted
            self.stats.compacted = compacted
        return foreign


@dataclass(frozen=True)
class Observed:
    revision: int
    compacted: int
    members: list[MemberStatus]

    def figures(self) -> dict[str, Any]:
        return {"pinned_bytes": max((m.db_size_in_use for m in self.members), default=0),
                "debt_bytes": max((m.free_bytes for m in self.members), default=0),
                "compacted_ts": self.compacted}


class EtcdAgent:
    def __init__(self, endpoints: str | list[str], bootstrap: str, cluster: str, *, node: str = "etcd-agent",
                 events_topic: str = DEFAULT_EVENTS_TOPIC, directives_topic: str = "safepoint.directives",
                 compact_every_s: float = 5.0, heartbeat_s: float = 1.0, defrag_free_bytes: int = 0,
                 allow_auto_compaction: bool = False, state_dir: str | os.PathLike[str] | None = None,
                 client: str = "confluent", kafka_conf: dict[str, Any] | None = None,
                 timeout_s: float = 5.0, node_key: str | None = None, directive_key: str | None = None) -> None:
        self.etcd = EtcdGateway(endpoints, timeout_s=timeout_s)
        self.node_key, self.directive_key = node_key, directive_key
        self.bootstrap, self.cluster, self.node = bootstrap, cluster, node
        self.events_topic, self.directives_topic = events_topic, directives_topic
        self.heartbeat_s = heartbeat_s
        self.defrag_free_bytes = defrag_free_bytes
        self.allow_auto_compaction = allow_auto_compaction
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.client, self.kafka_conf = client, kafka_conf or {}
        self.compactor = Compactor(compact_every_s)
        self.stats = self.compactor.stats
        self.observed: Observed | None = None
        self.reporter: Reporter | None = None
        self.listener: DirectiveListener | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        """Between the listener's thread (``_take``) and the loop (``_compact``, ``observe``)."""
        self._down_since: float | None = None
        self._backoff_s = heartbeat_s
        self._defrag_at: float | None = None
        self.on_beat: Callable[[], None] | None = None
        """Called after each heartbeat (``safepoint agent etcd --stats-file`` writes the counters)."""

    # -- start ------------------------------------------------------------------------------
    def check_auto_compaction(self) -> list[str]:
        """Refuse (``AutoCompactionOn``) when a member compacts by itself; the members whose
        setting cannot be told (warned about)."""
        unknown: list[str] = []
        on: list[str] = []
        for endpoint in self.etcd.member_endpoints():
            mode = self.etcd.auto_compaction(endpoint)
            if mode is None:
                continue
            (unknown if mode.startswith("unknown") else on).append(f"{endpoint}: {mode}")
        if on and not self.allow_auto_compaction:
            msg = ("etcd's own auto-compaction is on (" + "; ".join(on) + "): it compacts whatever safepoint holds, "
                   "so two compactors would break the guarantee. Start etcd without --auto-compaction-retention "
                   "(or with 0), or pass --allow-auto-compaction and accept that a held revision may be compacted "
                   "under its reader")
            raise AutoCompactionOn(msg)
        if on:
            log.warning("etcd agent: etcd's own auto-compaction is on (%s) and allowed: a held revision may be "
                        "compacted under its reader", "; ".join(on))
        for u in unknown:
            log.warning("etcd agent: cannot tell whether %s compacts by itself (%s); it must run without "
                        "--auto-compaction-retention", u.split(": ", 1)[0], u.split(": ", 1)[1])
        return unknown

    def _load_state(self) -> None:
        if self.state_dir is None:
            return
        path = self.state_dir / STATE_FILE
        if path.exists():
            saved = json.loads(path.read_text())
            self.compactor.seq = int(saved.get("seq", 0))
            self.compactor.generation = saved.get("generation")
            self.stats.directive_seq = self.compactor.seq
            log.info("etcd agent: last directive acted on before the restart: seq %d", self.compactor.seq)

    def _save_state(self) -> None:
        if self.state_dir is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps({"seq": self.compactor.seq, "compacted": self.compactor.compacted,
                                   "generation": self.compactor.generation}))
        tmp.replace(self.state_dir / STATE_FILE)

    def start(self) -> EtcdAgent:
        self.check_auto_compaction()
        self._load_state()
        self.observe()  # the first reading before the first heartbeat (raises when no member answers)
        self.reporter = Reporter(self.bootstrap, self.node, cluster=self.cluster, mvcc_clock=self._revision,
                                 figures=self._figures, heartbeat_interval_s=None, topic=self.events_topic,
                                 state_dir=self.state_dir, client=self.client, kafka_conf=self.kafka_conf,
                                 node_key=self.node_key)
        # its own thread, which rides out a broker away (retried with back-off) and hands each newer
        # directive to _take
        self.listener = DirectiveListener(self.bootstrap, self.cluster, topic=self.directives_topic,
                                          on_directive=self._take, reporter=self.reporter,
                                          kafka_conf=self.kafka_conf, client=self.client,
                                          directive_key=self.directive_key).start()
        log.info("etcd agent %s of cluster %s: etcd at %s, revision %d, compacted %d; compacting at most every %.1f s",
                 self.node, self.cluster, ",".join(self.etcd.endpoints), self._revision(), self.compactor.compacted,
                 self.compactor.interval_s)
        return self

    def _revision(self) -> int:
        return self.observed.revision if self.observed is not None else 0

    def _figures(self) -> dict[str, Any]:
        return self.observed.figures() if self.observed is not None else {}

    # -- the loop ---------------------------------------------------------------------------
    def observe(self) -> Observed:
        """Read the store: the revision, the compacted revision, every member's status."""
        members: list[MemberStatus] = []
        for endpoint in self.etcd.member_endpoints():
            try:
                members.append(self.etcd.status(endpoint))
            except (EtcdUnavailable, EtcdError) as exc:
                log.debug("etcd agent: member %s: %s", endpoint, exc)
        revision = self.etcd.revision()
        compacted = self.etcd.compacted_revision(self.compactor.compacted)
        with self._lock:
            foreign = self.compactor.seen(compacted)
        if foreign:
            log.error("etcd agent: etcd's compacted revision rose to %d without this agent (somebody else compacts "
                      "this cluster: etcd's own auto-compaction or an operator's etcdctl compact); a held revision may "
                      "have been compacted under its reader", compacted)
        self.observed = Observed(revision, self.compactor.compacted, members)
        return self.observed

    def stop(self) -> None:
        self._stop.set()

    def run(self, until: float | None = None) -> None:
        """Report, follow directives and compact until ``stop()`` (or the monotonic time ``until``)."""
        assert self.listener is not None and self.reporter is not None, "start() first"
        next_beat = 0.0
        try:
            while not self._stop.is_set() and (until is None or time.monotonic() < until):
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + (self._beat() or self.heartbeat_s)
                self._compact()
                self._stop.wait(min(0.1, max(0.0, next_beat - time.monotonic())))
        finally:
            self.close()

    def _beat(self) -> float | None:
        """Observe and heartbeat; the back-off before the next try when etcd cannot be read."""
        assert self.reporter is not None
        try:
            self.observe()
        except (EtcdUnavailable, EtcdError) as exc:
            self.stats.etcd_failures += 1
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.error("etcd agent: etcd cannot be read (%s); no heartbeat until it can (the job holds the safe "
                          "point when this node goes stale); retrying with back-off", exc)
            self._backoff_s = min(MAX_BACKOFF_S, self._backoff_s * 2)
            return self._backoff_s
        if self._down_since is not None:
            log.warning("etcd agent: etcd answers again after %.1f s", time.monotonic() - self._down_since)
            self._down_since = None
            self._backoff_s = self.heartbeat_s
        try:
            self.reporter.heartbeat()
            self.stats.heartbeats += 1
            if self.on_beat is not None:
                self.on_beat()
        except Exception:  # the broker is away: the reporter reconnects; a beat is lost, the next one tells
            log.warning("etcd agent: heartbeat not published; retrying in %.1f s", self.heartbeat_s, exc_info=True)
        return None

    def _take(self, directive: Directive) -> None:
        """A newer directive of the cluster (the listener's thread)."""
        with self._lock:
            taken = self.compactor.take(directive.seq, directive.safe_ts, directive.generation)
        if taken:
            log.debug("etcd agent: directive seq %d: safe_ts %d", directive.seq, directive.safe_ts)
        else:
            log.info("etcd agent: directive seq %d ignored: not newer than seq %d", directive.seq, self.compactor.seq)

    def _compact(self) -> None:
        if self.observed is None or self._down_since is not None:
            return
        now = time.monotonic()
        with self._lock:
            revision = self.compactor.due(now, self.observed.revision)
            seq = self.compactor.seq
        if revision is None:
            return
        was = self.compactor.compacted
        try:
            self.etcd.compact(revision)
        except RevisionCompacted:
            self.compactor.last_at = now
            with contextlib.suppress(EtcdUnavailable, EtcdError):
                self.observe()  # compacted past it meanwhile (by somebody else): read where it is
            return
        except (EtcdUnavailable, EtcdError) as exc:
            self.stats.etcd_failures += 1
            self.compactor.last_at = now  # retried after an interval
            log.warning("etcd agent: compaction at revision %d failed: %s; retrying in %.1f s", revision, exc,
                        self.compactor.interval_s)
            return
        with self._lock:
            self.compactor.done(revision, now)
            self._save_state()
        log.info("etcd agent: compacted etcd at revision %d (directive seq %d; was %d: %d revisions of history "
                 "dropped; compaction %d)", revision, seq, was, revision - was, self.stats.compactions)
        if self.defrag_free_bytes:
            self._defragment(now)

    def _defragment(self, now: float) -> None:
        if self._defrag_at is not None and now - self._defrag_at < self.compactor.interval_s:
            return
        try:
            members = [self.etcd.status(e) for e in self.etcd.member_endpoints()]
        except (EtcdUnavailable, EtcdError) as exc:
            log.warning("etcd agent: no defragmentation: a member's status cannot be read (%s)", exc)
            return
        due = sorted((m for m in members if m.free_bytes >= self.defrag_free_bytes), key=lambda m: m.is_leader)
        if not due:
            return
        member = due[0]  # one member at a time, followers first
        self._defrag_at = now
        try:
            self.etcd.defragment(member.endpoint)
        except (EtcdUnavailable, EtcdError) as exc:
            log.warning("etcd agent: defragmentation of %s failed: %s", member.endpoint, exc)
            return
        self.stats.defragmentations += 1
        log.info("etcd agent: defragmented %s%s (%d bytes free of %d)", member.endpoint,
                 " (leader)" if member.is_leader else "", member.free_bytes, member.db_size)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        if self.reporter is not None:
            self.reporter.close()
        self.etcd.close()
        log.info("etcd agent %s stopped: %s", self.node, json.dumps(asdict(self.stats)))

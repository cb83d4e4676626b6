"""The live screen of ``safepoint view`` and ``safepoint demo``: what the job decided, read back from
its directives, alerts and status topics, drawn with rich to the terminal's width. The status
parts go into a ``StatusStore``, the model the HTTP surface serves: the screen shows each
cluster's round (and why it aborts) and the oldest holds from it.

``ViewState`` takes the decoded messages and holds what the screen shows; ``screen`` draws it for
a moment ``now_ms``: ages and lags are computed against now, not against the last directive, so
a cluster that went silent shows its lag growing. When the MVCC unit is a time unit
(``mvcc_unit``: ``ns``, ``us``, ``ms`` or ``s``), safe points are shown as UTC times and lags in
seconds; otherwise as the raw numbers.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import queue
import sys
import time
from collections import deque
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from safepoint.ops.status_store import StatusStore
from safepoint.settings import Settings

__all__ = ["MVCC_UNITS", "LiveView", "ViewState", "follow", "human_bytes", "human_ms", "render_text", "screen", "show"]

MVCC_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
"""Seconds per MVCC unit, for the units that are times (``none``: an opaque counter)."""


def human_ms(ms: float | None) -> str:
    """A duration for people: ``850 ms``, ``49 s``, ``12 min``, ``2.1 h``."""
    if ms is None:
        return "?"
    if abs(ms) < 1_000:
        return f"{ms:.0f} ms"
    if abs(ms) < 60_000:
        return f"{ms / 1000:.0f} s"
    if abs(ms) < 3_600_000:
        return f"{ms / 60_000:.0f} min"
    return f"{ms / 3_600_000:.1f} h"


def human_bytes(n: float | None) -> str:
    """A size for people, in decimal units: ``2.4 GB``."""
    if n is None:
        return "?"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


class ViewState:
    """What the screen shows, from the job's directives and alerts (as decoded JSON objects)."""

    def __init__(self, mvcc_unit: str = "none", units: dict[str, str] | None = None) -> None:
        self.seconds_per_unit = MVCC_UNITS.get(mvcc_unit)
        """Seconds per MVCC unit of a cluster without a unit of its own (None: not a time)."""
        self.units = {c: MVCC_UNITS.get(u) for c, u in (units or {}).items()}
        """cluster -> its own seconds per unit (``[clusters.NAME] mvcc_unit``: revisions are no time)."""
        self.latest: dict[str, dict[str, Any]] = {}
        self.directives: deque[dict[str, Any]] = deque(maxlen=6)
        self.alerts: deque[dict[str, Any]] = deque(maxlen=6)
        self.raised: dict[str, dict[str, Any]] = {}
        self.count = 0
        self.bands: dict[str, dict[str, dict[str, Any]]] = {}  # node -> kind -> the raising alert
        self.expired: deque[dict[str, Any]] = deque(maxlen=4)
        self.expire_seq: dict[str, int] = {}
        self.status = StatusStore(history=1)
        """The status parts read from the status topic (``apply_raw`` each message)."""

    def directive(self, value: dict[str, Any]) -> dict[str, Any] | None:
        """Take one message of the directives topic; returns a new expiry (the demo's simulator
        obeys it), else None."""
        if value.get("type") == "expire":
            if value["seq"] > self.expire_seq.get(value["cluster"], 0):
                self.expire_seq[value["cluster"]] = value["seq"]
                self.expired.append(value)
                return value
        elif value.get("type", "compaction") == "compaction":
            prev = self.latest.get(value["cluster"])
            if prev is None or value["seq"] > prev["seq"]:
                self.latest[value["cluster"]] = value
                self.directives.append(value)
                self.count += 1
        return None

    def alert(self, value: dict[str, Any]) -> None:
        self.alerts.append(value)
        if value["state"] == "raised":
            self.raised[value["id"]] = value
        else:
            self.raised.pop(value["id"], None)
        if value["kind"] in ("pinned_bytes", "reader_age") and value.get("node"):
            node_bands = self.bands.setdefault(value["node"], {})
            if value["state"] == "raised":
                node_bands[value["kind"]] = value
            else:
                node_bands.pop(value["kind"], None)

    # -- drawing ------------------------------------------------------------------------------
    def unit_of(self, cluster: str | None) -> float | None:
        """Seconds per MVCC unit of ``cluster`` (None: its timestamps are no time)."""
        return self.units[cluster] if cluster is not None and cluster in self.units else self.seconds_per_unit

    def _when(self, ts: int, cluster: str | None) -> dt.datetime | None:
        """``ts`` as a UTC time where ``cluster``'s MVCC unit is a time (None: it is not)."""
        per = self.unit_of(cluster)
        return None if per is None else dt.datetime.fromtimestamp(ts * per, tz=dt.UTC)

    def ts_text(self, ts: int | None, cluster: str | None = None) -> str:
        if ts is None:
            return "-"
        when = self._when(ts, cluster)
        return str(ts) if when is None else when.strftime("%H:%M:%S.%f")[:-3]

    def ts_full(self, ts: int | None, cluster: str | None = None) -> str:
        """``ts`` as a UTC date and time when ``cluster``'s MVCC unit is a time (with the number beside it),
        else the number."""
        if ts is None:
            return "-"
        when = self._when(ts, cluster)
        return str(ts) if when is None else f"{when.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]} UTC ({ts})"

    def lag_ms(self, safe_ts: int, now_ms: int, cluster: str | None = None) -> float | None:
        """How far the safe point is behind now, in ms (None when the MVCC unit is not a time)."""
        per = self.unit_of(cluster)
        if per is None:
            return None
        return now_ms - safe_ts * per * 1000


def _band_text(kind: str, alert: dict[str, Any]) -> str:
    value = human_bytes(alert["value"]) if kind == "pinned_bytes" else human_ms(alert["value"])
    return f"{kind} {alert['severity']} ({value})"


def screen(state: ViewState, title: str, status: str, now_ms: int) -> Group:
    """The whole screen at ``now_ms`` (milliseconds since the epoch)."""
    parts: list[Any] = [Text(f"{title}   {status}   directives seen: {state.count}", style="bold"), Text("")]
    clusters = Table(box=None, pad_edge=False, expand=False)
    times = all(state.unit_of(c) is not None for c in state.latest) and state.seconds_per_unit is not None
    for name, justify in (("cluster", "left"), ("seq", "right"), ("safe point (UTC)" if times else "safe_ts", "right"),
                          ("lag now", "right"), ("catalog floor", "right"), ("held back by", "left")):
        clusters.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for name, d in sorted(state.latest.items()):
        b = d.get("blocker") or {}
        blocker = " ".join(str(x) for x in (b.get("node"), b.get("kind"), b.get("id"), b.get("label")) if x)
        if b.get("age_ms") is not None:
            age = b["age_ms"] + max(0, now_ms - d["cluster_wall_ms"])  # as old as it is now
            blocker += f", open {human_ms(age)}"
        if b.get("cost_bytes") is not None:
            blocker += f", alone keeps {human_bytes(b['cost_bytes'])}"
        floor = d.get("catalog_floor")
        clusters.add_row(name, str(d["seq"]), state.ts_text(d["safe_ts"], name),
                         human_ms(state.lag_ms(d["safe_ts"], now_ms, name)),
                         "-" if floor is None else str(floor), blocker or "-")
    parts.append(clusters if state.latest else Text("(waiting for the first directive: Spark starts, then every node "
                                                    "reports within the discovery window)"))
    for name, d in sorted(state.latest.items()):
        if d.get("namespace_safe_ts") is not None:
            own = ", ".join(f"{ns} {state.ts_text(b, name)}" for ns, b in sorted(d.get("namespaces", {}).items()))
            parts.append(Text(f"cluster {name} per namespace: {own + '; ' if own else ''}every other namespace "
                              f"{state.ts_text(d['namespace_safe_ts'], name)}", overflow="fold"))
    parts += _status_parts(state, now_ms)
    noisy = {node: kinds for node, kinds in sorted(state.bands.items()) if kinds}
    parts += [Text(""), Text("pressure bands (every node is normal unless listed)", style="bold")]
    for node, kinds in noisy.items():
        parts.append(Text(f"  {node}: " + ", ".join(_band_text(k, a) for k, a in sorted(kinds.items()))))
    if state.expired:
        parts += [Text(""), Text("forced expiries", style="bold")]
        for e in list(state.expired)[::-1]:
            at = e.get("cluster_wall_ms")
            when = f" {human_ms(now_ms - at)} ago" if at is not None else ""
            parts.append(Text(f"  {e['mode']} {e['node']} {e.get('reader_id') or e.get('tx_id')}{when}: {e['reason']}",
                              overflow="ellipsis", no_wrap=True))
    parts += [Text(""), Text("recent directives", style="bold")]
    for d in list(state.directives)[::-1]:
        floor = f", catalog floor {d['catalog_floor']}" if d.get("catalog_floor") is not None else ""
        parts.append(Text(f"  {d['cluster']} seq {d['seq']}: safe point {state.ts_text(d['safe_ts'], d['cluster'])}{floor}"))
    parts += [Text(""), Text(f"active alerts: {len(state.raised)}   recent:", style="bold")]
    for a in list(state.alerts)[::-1]:
        parts.append(Text(f"  {a['state']} {a['severity']} {a['kind']}: {a['detail']}", overflow="ellipsis",
                          no_wrap=True))
    return Group(*parts)


def _status_parts(state: ViewState, now_ms: int, top: int = 5) -> list[Any]:
    """Each cluster's round and its oldest holds, from the status (nothing before the first part)."""
    statuses = state.status.all()
    if not statuses:
        return []
    parts: list[Any] = [Text("")]
    holds = Table(box=None, pad_edge=False, expand=False, title=None)
    for name, justify in (("oldest holds: cluster", "left"), ("node", "left"), ("kind", "left"), ("id", "left"),
                          ("label", "left"), ("ts", "right"), ("open", "right")):
        holds.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    rows = 0
    for st in statuses:
        r = st["round"]
        total = r.get("reasons_total", len(r["reasons"]))
        why = "; ".join(x["detail"] for x in r["reasons"][:3]) + (f" (+{total - 3} more)" if total > 3 else "")
        parts.append(Text(f"cluster {st['cluster']}: round " + (f"aborted: {why}" if r["aborted"] else "ok")
                          + f"; holds {st['hold_counts']['reader']} readers, "
                          + f"{st['hold_counts']['tx'] + st['hold_counts']['prepared_tx']} transactions",
                          style="red" if r["aborted"] else "", overflow="fold"))
        behind = max(0, now_ms - st["cluster_wall_ms"]) if st.get("cluster_wall_ms") is not None else 0
        for h in [h for h in st["holds"] if h["kind"] not in ("retention", "group")][:top]:
            age = None if h["age_ms"] is None else h["age_ms"] + behind
            holds.add_row(st["cluster"], h["node"], h["kind"], h["id"] or "-", h["label"] or "-", state.ts_text(h["ts"], st["cluster"]),
                          human_ms(age))
            rows += 1
    if rows:
        parts += [Text(""), holds]
    return parts


def render_text(group: Group, width: int) -> str:
    """The screen as plain text ``width`` columns wide (for logs, tests and non-terminals)."""
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False, color_system=None, soft_wrap=False).print(group)
    return out.getvalue()


# -- following a running job: safepoint view (and the demo's screen) ---------------------------------


class LiveView:
    """Follows the directives, alerts and status topics into a ``ViewState`` (``ops/view.py``)."""

    def __init__(self, settings: Settings, expiries: queue.Queue[tuple[str, str, str]] | None = None) -> None:
        from safepoint.connectors.kafka.follow import TopicFollower

        self.settings = settings
        self.follower = TopicFollower(settings.librdkafka(logger=logging.getLogger("safepoint.librdkafka")),
                                      [settings.directives_topic, settings.alerts_topic, settings.status_topic],
                                      client_id="safepoint-view", partial=True)  # idle once caught up; a
        # topic not made yet (no job has written its status) leaves the others on the screen
        self.state = ViewState(settings.mvcc_unit, {c: t["mvcc_unit"] for c, t in settings.clusters.items()
                                                    if "mvcc_unit" in t})
        self.expiries = expiries

    @property
    def count(self) -> int:
        return self.state.count

    @property
    def latest(self) -> dict[str, dict[str, Any]]:
        return self.state.latest

    def poll(self, timeout: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in self.follower.poll(max(0.0, deadline - time.monotonic())):
                raw = msg.value()
                if raw is None:
                    continue
                if msg.topic() == self.settings.status_topic:
                    self.state.status.apply_raw(msg.key(), raw)
                    continue
                try:
                    value = json.loads(raw)
                except ValueError:
                    continue  # not a record the job writes: the screen shows what it can
                if not isinstance(value, dict):
                    continue
                try:
                    if msg.topic() == self.settings.directives_topic:
                        expiry = self.state.directive(value)
                        if expiry is not None and self.expiries is not None and "reader_id" in expiry:
                            self.expiries.put((expiry["cluster"], expiry["node"], expiry["reader_id"]))
                    elif value.get("type") == "alert":
                        self.state.alert(value)
                except (KeyError, TypeError):
                    continue  # a record without the fields the job writes: left off the screen

    def render(self, title: str, status: str) -> Group:
        return screen(self.state, title, status, time.time_ns() // 1_000_000)

    def close(self) -> None:
        self.follower.close()


def show(group: Group, tty: bool, last_print: float) -> float:
    """Redraw the screen on a terminal (fitted to its width); elsewhere (logs, CI) print it every
    5 s, 120 columns wide (or $COLUMNS). Returns last_print."""
    if tty:
        console = Console()
        console.clear()
        console.print(group)
    elif time.monotonic() - last_print >= 5:
        last_print = time.monotonic()
        print(render_text(group, int(os.environ.get("COLUMNS", "120"))), flush=True)
    return last_print


def follow(settings: Settings, duration_s: float | None) -> int:
    """``safepoint view``: follow a running job's outputs until Ctrl-C or the duration ends."""
    from safepoint.connectors.kafka.topics import check_reachable

    check_reachable(settings.librdkafka())
    view = LiveView(settings)
    start = time.monotonic()
    tty = sys.stdout.isatty()
    last_print = 0.0
    try:
        while duration_s is None or time.monotonic() - start < duration_s:
            view.poll(1.0)
            group = view.render(f"safepoint view {settings.bootstrap} {settings.directives_topic}",
                                f"t+{time.monotonic() - start:.0f}s")
            last_print = show(group, tty, last_print)
    except KeyboardInterrupt:
        pass
    finally:
        view.close()
    return 0

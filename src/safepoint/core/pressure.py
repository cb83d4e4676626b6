"""Pressure on one node, decided on its own clock: bands, in-doubt transactions, forced expiry.

``Pressure`` is the node's part that owns this state. After each applied event the node stage
runs ``Pressure.step``: the pinned-bytes band (on a
heartbeat that reports ``pinned_bytes``) and the oldest-hold age band move with hysteresis
(``bands.py``), a prepared transaction undecided for ``in_doubt_timeout_ms`` is alerted, and
under sustained critical pressure the holds that pin the most are expired, graceful first and
hard after the grace period (NornicDB's MVCC lifecycle design). It also looks ahead: the growth
rate of ``pinned_bytes`` (and of ``debt_bytes``) is fitted over the heartbeats of the last
``forecast_window_ms``, and when the pinned bytes would reach the critical threshold within
``forecast_horizon_ms`` at that rate, ``pressure_forecast`` is raised with the projected time (it
clears once the projection is 25% past the horizon, the growth stops, or the node is critical:
the critical band alert speaks then). What it decides comes out as the
update's ``signals`` (``core/signals.py``: alert changes, expire orders, band changes, the debt's
report), which the cluster stage stamps with the cluster's identity and time.
"""

from __future__ import annotations

from typing import Any, Literal

from safepoint.core.alert_kinds import Severity
from safepoint.core.bands import LEVEL_NAMES, Band, BandSpec, band_step
from safepoint.core.holds import KIND, NEVER, HoldSet, Oldest
from safepoint.core.ids import join_id
from safepoint.core.policy import Policy
from safepoint.core.records import Expiry, Hold, HoldRef
from safepoint.core.signals import BandChange, DebtReport, ExpireOrder, Signal, alert_change

__all__ = ["Forecast", "Holds", "Pressure"]

FORECAST_SAMPLES = 24
"""Heartbeat samples a node keeps for its growth rates: one per ``forecast_window_ms / 24`` (the
newest replaces the last when they are closer), so the fit costs the same at any heartbeat rate."""
FORECAST_MIN_SAMPLES = 3
FORECAST_CLEAR = 1.25
"""A raised forecast clears once the projected time exceeds the horizon by this factor."""




class Holds:
    """What pressure reads of a node: its name, its open holds, pinned bytes, and its newest
    incarnation (only that process's holds are expired: an older one's go with its silence)."""

    __slots__ = ("node", "held", "pinned_bytes", "incarnation")

    def __init__(self, node: str, held: HoldSet, pinned_bytes: int | None, incarnation: int = 0) -> None:
        self.node = node
        self.held = held
        self.pinned_bytes = pinned_bytes
        self.incarnation = incarnation

    def of(self, kind: str) -> dict[str, Hold]:
        return self.held.of(kind)

    def oldest(self) -> Oldest | None:
        """The longest-open hold."""
        return self.held.oldest()


_specs: list[Any] = [None, None, None]
"""The last policy's band specs (building them is a dataclass per call; one policy serves a run)."""


def _band_specs(policy: Policy) -> tuple[BandSpec, BandSpec]:
    if _specs[0] is not policy:
        _specs[:] = [policy, policy.pinned_band(), policy.age_band()]
    return _specs[1], _specs[2]


def _slope(points: list[tuple[int, int]]) -> float | None:
    """The least-squares slope of (time, value) points, per ms (None: too few, or no time between them)."""
    n = len(points)
    if n < FORECAST_MIN_SAMPLES:
        return None
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var


class _Unfit:
    """A rate not fitted to the samples yet."""


_UNFIT = _Unfit()


class Forecast:
    """A node's recent heartbeats ([wall, pinned_bytes, debt_bytes or -1], spaced over the window),
    the growth rates fitted to them, and the raised forecast alert's start (None: not raised). A rate
    is fitted when it is first read after the samples changed."""

    __slots__ = ("samples", "_pinned_rate", "_debt_rate", "raised_since")

    def __init__(self, samples: list[list[int]] | None = None, raised_since: int | None = None) -> None:
        self.samples: list[list[int]] = samples or []
        self.raised_since = raised_since
        self._pinned_rate: float | None | _Unfit = _UNFIT
        self._debt_rate: float | None | _Unfit = _UNFIT

    @property
    def pinned_per_ms(self) -> float | None:
        """The pinned bytes' growth per ms over the samples (None: too few, or no time between them)."""
        rate = self._pinned_rate
        if isinstance(rate, _Unfit):
            rate = self._pinned_rate = _slope([(t, p) for t, p, _d in self.samples])
        return rate

    @property
    def debt_per_ms(self) -> float | None:
        """The compaction debt's growth per ms over the samples that carry it."""
        rate = self._debt_rate
        if isinstance(rate, _Unfit):
            rate = self._debt_rate = _slope([(t, d) for t, _p, d in self.samples if d >= 0])
        return rate

    def to_json(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        return {"samples": self.samples, **({"raised_since": self.raised_since} if self.raised_since is not None else {})}

    def add(self, now: int, pinned: int, debt: int | None, window_ms: int) -> None:
        """Take one heartbeat's figures (the rates are fitted again when next read)."""
        sample = [now, pinned, -1 if debt is None else debt]
        if len(self.samples) > 1 and now - self.samples[-2][0] < window_ms // FORECAST_SAMPLES:
            self.samples[-1] = sample  # the last one is too close to the one before: it moves to the newest figures
        else:
            self.samples.append(sample)
        cut = 0
        while cut < len(self.samples) - 1 and now - self.samples[cut][0] > window_ms:
            cut += 1
        if cut:
            del self.samples[:cut]
        self._pinned_rate = self._debt_rate = _UNFIT

    def time_to_critical(self, pinned: int | None, critical: int, is_critical: bool) -> int | None:
        """The time (ms) until ``pinned`` reaches ``critical`` at the fitted rate (None: not growing,
        not known, or already in the critical band)."""
        rate = self.pinned_per_ms
        if is_critical or pinned is None or rate is None or rate <= 0:
            return None
        return max(0, int((critical - pinned) / rate))


class Pressure:
    """A node's pressure state: its two bands, the prepared transactions alerted as in doubt, the
    holds it expired (and how), the times of its recent expire directives (the rate limit), and
    the forecast of its pinned bytes."""

    __slots__ = ("pinned_band", "age_band", "in_doubt", "expiries", "expire_walls", "forecast", "debt_growing")

    def __init__(self, pinned_band: Band | None = None, age_band: Band | None = None, in_doubt: list[str] | None = None,
                 expiries: dict[str, Expiry] | None = None, expire_walls: list[int] | None = None,
                 forecast: Forecast | None = None, debt_growing: bool = False) -> None:
        """A new node's pressure, quiet (no arguments), or ``from_stored``'s parts."""
        self.pinned_band = Band() if pinned_band is None else pinned_band
        self.age_band = Band() if age_band is None else age_band
        self.in_doubt: list[str] = [] if in_doubt is None else in_doubt  # prepared tx ids alerted as in doubt
        self.expiries: dict[str, Expiry] = {} if expiries is None else expiries  # join_id(kind, id) -> its expiry
        self.expire_walls: list[int] = [] if expire_walls is None else expire_walls  # recent expire directives (rate limit)
        self.forecast = Forecast() if forecast is None else forecast
        self.debt_growing = debt_growing
        """In the critical band with debt still growing (the cluster's emergency, ``core/emergency.py``)."""

    def to_stored(self) -> list[Any]:
        """The node's stored fields of pressure, in ``STORED_FIELDS``' order, each empty one (and a
        quiet band) as None (``NodeState.to_stored``)."""
        return [None if self.pinned_band.quiet else self.pinned_band.to_json(),
                None if self.age_band.quiet else self.age_band.to_json(),
                self.in_doubt or None, {k: e.to_json() for k, e in self.expiries.items()} or None,
                self.expire_walls or None, self.forecast.to_json(), self.debt_growing or None]

    @classmethod
    def from_stored(cls, pinned_band: list[Any] | None, age_band: list[Any] | None, in_doubt: list[str] | None,
                    expiries: dict[str, list[Any]] | None, expire_walls: list[int] | None,
                    forecast: dict[str, Any] | None, debt_growing: bool | None) -> Pressure:
        """``to_stored``'s values back (None: as new, as in checkpoints written before the pressure
        policy existed), taking over their lists and maps."""
        return cls(Band.from_json(pinned_band), Band.from_json(age_band), in_doubt or [],
                   {k: Expiry.from_json(e) for k, e in expiries.items()} if expiries else {}, expire_walls or [],
                   Forecast(forecast.get("samples"), forecast.get("raised_since")) if forecast else Forecast(),
                   bool(debt_growing))

    def busy(self) -> bool:
        """Something is in doubt, expiring or recently expired, the pinned band is critical or the age
        band is not quiet: ``step`` has work at any time (``still_until`` is -infinity)."""
        return bool(self.in_doubt or self.expiries or self.expire_walls or self.pinned_band.level == 2
                    or not self.age_band.quiet)

    def still_until(self, first_opened: float, first_prepared: float, policy: Policy) -> float:
        """The node's clock below which ``step``, after an event that is no heartbeat and closes
        nothing in doubt or expiring, would decide nothing and change nothing (-infinity: at no
        time), when every hold opened at or after ``first_opened`` and every prepared transaction
        was prepared at or after ``first_prepared`` (lower bounds will do: they only lower the
        bound). Below it nothing is in doubt, expiring or recently expired, the pinned band is not
        critical, the age band is quiet and the oldest hold's age stays below its thresholds, and
        no prepared transaction reaches ``in_doubt_timeout_ms``. It holds until ``step`` runs again.
        ``step`` begins with it (its own early exit), and the node's shortcut keeps it as holds come."""
        if self.busy():
            return -NEVER
        spec = _band_specs(policy)[1]
        # band_step's own test for a quiet band that stays quiet, max(now - first_opened, 0) < both
        # enter thresholds, as a bound on now
        limit = min(spec.warning_enter, spec.critical_enter)
        if limit <= 0:
            return -NEVER
        return min(first_opened + limit, first_prepared + policy.in_doubt_timeout_ms)

    def step(self, holds: Holds, now: int, pinned_sample: bool, closed: list[HoldRef], policy: Policy,
             debt: int | None = None) -> list[Signal]:
        """Move the bands, in-doubt and expiry state after one event at the node's time ``now``;
        what it decides."""
        if not pinned_sample and not self.busy() and now < self.still_until(*holds.held.earliest(), policy):
            return []  # nothing to decide (the node's shortcut asks the same of still_until)
        signals: list[Signal] = []
        node = holds.node
        for kind, hid in closed:  # what closed is no longer in doubt, expiring, or aged
            if hid in self.in_doubt and KIND[kind].preparable:
                self.in_doubt.remove(hid)
                signals.append(alert_change(node, "in_doubt_tx", join_id("in_doubt_tx", node, hid), "cleared", "warning",
                                      None, policy.in_doubt_timeout_ms, now, f"transaction {hid} was decided"))
            exp = self.expiries.pop(join_id(kind, hid), None) if self.expiries else None
            if exp is not None:
                signals.append(alert_change(node, "forced_expiry", join_id("forced_expiry", node, kind, hid), "cleared",
                                      "critical" if exp.mode == "hard" else "warning", None, None, now,
                                      f"{exp.kind} {hid} expired {exp.mode} is closed"))
        pinned_spec, age_spec = _band_specs(policy)
        if pinned_sample and holds.pinned_bytes is not None:
            signals += _band(holds, "pinned_bytes", self.pinned_band, pinned_spec, now, holds.pinned_bytes)
            if policy.forecast_horizon_ms or policy.emergency_exit_ms:
                signals += self._forecast(holds, holds.pinned_bytes, debt, now, policy)
        oldest = holds.oldest()
        age = now - oldest[2] if oldest is not None else 0
        signals += _band(holds, "reader_age", self.age_band, age_spec, now, max(age, 0), oldest)
        for tid, h in holds.held.preparable():
            if h.prepared and h.prepared_wall is not None and tid not in self.in_doubt:
                waited = now - h.prepared_wall
                if waited >= policy.in_doubt_timeout_ms:
                    self.in_doubt.append(tid)
                    signals.append(alert_change(
                        node, "in_doubt_tx", join_id("in_doubt_tx", node, tid), "raised", "warning", waited,
                        policy.in_doubt_timeout_ms, h.prepared_wall,
                        f"prepared transaction {tid} undecided for {waited} ms (coordinator {h.coordinator}, "
                        f"participants {', '.join(h.participants or [])}); it pins ts {h.ts} until decided"))
        if policy.expire_enabled:
            signals += self._expire(holds, now, policy)
        return signals

    def _forecast(self, holds: Holds, pinned: int, debt: int | None, now: int, policy: Policy) -> list[Signal]:
        """Fit the growth rates to this heartbeat and raise or clear ``pressure_forecast``; what it says."""
        signals: list[Signal] = []
        f = self.forecast
        f.add(now, pinned, debt, policy.forecast_window_ms)
        growing = self.pinned_band.level == 2 and f.debt_per_ms is not None and f.debt_per_ms > 0
        if growing != self.debt_growing and policy.emergency_exit_ms:
            self.debt_growing = growing
            debt_rate = round((f.debt_per_ms or 0) * 1000)
            signals.append(DebtReport(growing, debt_rate))
        if not policy.forecast_horizon_ms:
            return signals
        critical = policy.pinned_critical_enter_bytes
        ttc = f.time_to_critical(pinned, critical, self.pinned_band.level == 2)
        node = holds.node
        aid = join_id("pressure_forecast", node)
        horizon = policy.forecast_horizon_ms
        if f.raised_since is None:
            if ttc is None or ttc > horizon:
                return signals
            f.raised_since = now
            rate = (f.pinned_per_ms or 0) * 1000
            signals.append(alert_change(node, "pressure_forecast", aid, "raised", "warning", ttc, horizon, now,
                                  f"pinned bytes {pinned} growing {rate:.0f} bytes/s: the critical threshold {critical} "
                                  f"in about {ttc // 1000} s at this rate (horizon {horizon // 1000} s)"))
        elif ttc is None or ttc > horizon * FORECAST_CLEAR:
            since, f.raised_since = f.raised_since, None
            why = ("the node is in the critical band" if self.pinned_band.level == 2 else
                   "its pinned bytes stopped growing" if ttc is None else
                   f"the critical threshold is now about {ttc // 1000} s away")
            signals.append(alert_change(node, "pressure_forecast", aid, "cleared", "warning", ttc, horizon, since,
                                  f"pinned bytes {pinned}: {why}"))
        return signals

    def _expire(self, holds: Holds, now: int, policy: Policy) -> list[Signal]:
        """Under critical pressure sustained for expire_after_ms, expire the holds that pin the
        most (lowest ts first) among those open longer than max_reader_lifetime_ms, graceful
        first and hard after the grace period, at most max_expiries_per_window per window.
        Prepared transactions are never expired: their fate belongs to their coordinator. The expire
        orders and alerts it decides."""
        signals: list[Signal] = []
        if self.expire_walls:
            self.expire_walls = [w for w in self.expire_walls if now - w < policy.expire_window_ms]
        if self.pinned_band.level != 2:
            return signals  # nothing is expired, or upgraded to hard, outside the critical band
        budget = policy.max_expiries_per_window - len(self.expire_walls)

        def upgrade_order(kv: tuple[str, Expiry]) -> tuple[Any, ...]:
            """First expired first; among one moment's expiries, the hold that pins the most."""
            exp = kv[1]
            h = holds.of(exp.kind)[exp.id]
            return exp.at_wall, h.ts, h.opened_wall, exp.kind, exp.id

        for _key, exp in sorted(self.expiries.items(), key=upgrade_order):
            if budget <= 0:
                return signals
            if holds.of(exp.kind)[exp.id].prepared:
                continue  # prepared since its graceful expiry: its fate belongs to its coordinator now
            if exp.mode == "graceful" and now - exp.at_wall >= policy.expire_grace_ms:
                exp.mode, exp.at_wall = "hard", now
                signals += self._emit_expire(holds, exp.kind, exp.id, "hard", now)
                budget -= 1
        critical_since = self.pinned_band.since
        if budget <= 0 or critical_since is None or now - critical_since < policy.expire_after_ms:
            return signals
        candidates = [
            (h.ts, h.opened_wall, kind, hid)
            for kind, hid, h in holds.held.items()
            if join_id(kind, hid) not in self.expiries
            and now - h.opened_wall >= policy.max_reader_lifetime_ms
            and not h.prepared
            and h.incarnation == holds.incarnation
        ]
        for _ts, _wall, kind, hid in sorted(candidates)[:budget]:
            self.expiries[join_id(kind, hid)] = Expiry(kind, "graceful", now, hid)
            signals += self._emit_expire(holds, kind, hid, "graceful", now)
        return signals

    def _emit_expire(self, holds: Holds, kind: str, hid: str, mode: str, now: int) -> list[Signal]:
        self.expire_walls.append(now)
        h = holds.of(kind)[hid]
        node = holds.node
        reason = (f"critical pinned-bytes pressure ({holds.pinned_bytes} bytes); {kind} open "
                  f"{now - h.opened_wall} ms pins ts {h.ts}")
        body: dict[str, Any] = {"v": 1, "type": "expire", "node": node,
                                KIND[kind].id_field: hid, "reason": reason, "mode": mode}
        return [ExpireOrder(body),
                alert_change(node, "forced_expiry", join_id("forced_expiry", node, kind, hid), "raised",
                             "critical" if mode == "hard" else "warning", h.ts, None, now,
                             f"{mode} expiry of {kind} {hid}" + (f" ({h.label})" if h.label else "") + f": {reason}")]


def _severity(level: int) -> Severity:
    """The alert's severity of a band's level above normal (``LEVEL_NAMES``)."""
    return "critical" if level == 2 else "warning"


def _band(holds: Holds, kind: Literal["pinned_bytes", "reader_age"], band: Band, spec: BandSpec, now: int, value: int,
          oldest: Oldest | None = None) -> list[Signal]:
    """Move one band; the band change (pinned bytes: the node's admission follows it) and its alert."""
    change = band_step(band, spec, now, value)
    if change is None:
        return []
    signals: list[Signal] = []
    old, new, since = change
    what = f"pinned bytes {value}" if kind == "pinned_bytes" else f"oldest reader/transaction open {value} ms"
    if kind == "pinned_bytes" and oldest is None:
        oldest = holds.oldest()
    if oldest is not None:
        what += f"; oldest {oldest[0]} {oldest[1]}" + (f" ({oldest[3]})" if oldest[3] else "")
    node = holds.node
    if kind == "pinned_bytes":  # the node's admission control follows its pinned band (a band directive)
        signals.append(BandChange(LEVEL_NAMES[new]))
    if new == 0:
        signals.append(alert_change(node, kind, join_id(kind, node), "cleared", _severity(old), value,
                              spec.exit(old), since, f"{what}: back below the {LEVEL_NAMES[old]} exit threshold"))
    else:
        signals.append(alert_change(node, kind, join_id(kind, node), "raised", _severity(new), value,
                              spec.enter(new) if new > old else spec.exit(old), since,
                              f"{what}: {LEVEL_NAMES[new]} band"))
    return signals

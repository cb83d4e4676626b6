"""The policy: every knob the core's decisions depend on, with the contract's defaults.

The same policy given to ``safepoint replay`` and ``safepoint run`` yields the same output
for the same event log. Time values are in the unit of the field they bound: ``*_ms`` in
wall-clock milliseconds (event time), ``retention`` in MVCC units.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache
from typing import Any

from safepoint.core.bands import BandSpec

__all__ = ["JOB_FIELDS", "MVCC_UNITS", "Policies", "Policy"]

GIB = 1 << 30
_BOOL_FIELDS = frozenset({"expire_enabled", "control_on_events_topic"})
_STR_FIELDS = frozenset({"mvcc_unit"})
SECRET_FIELDS = frozenset({"control_keys", "node_key_secret", "directive_keys"})
"""Policy keys that are secrets: no flag, never printed, left out of what the source is given."""
JOB_FIELDS = frozenset({"generation"})
"""Policy keys the job sets itself, not settings: ``generation``."""
MVCC_UNITS = ("none", "counter", "revision", "xid", "trx", "ns", "us", "ms", "s")
"""What a cluster's MVCC timestamps count: an opaque counter (``none``, ``counter``), etcd's store
``revision``, PostgreSQL's 64-bit ``xid``, InnoDB's transaction numbers (``trx``: MariaDB), or a clock (``ns``, ``us``, ``ms``, ``s``: shown as times)."""


@dataclass(frozen=True, slots=True)
class Policy:
    """Decision parameters of the core. Frozen: a running job never changes its policy."""

    retention: int = 0
    """History every node keeps regardless of readers, in MVCC units (0: keep none)."""
    node_lease_ms: int = 30_000
    """A node whose last event is older than this, in cluster time, is stale."""
    max_service_hold_ttl_ms: int = 3_600_000
    """The longest TTL a service hold may have (longer ones are refused; 0: any). It also bounds how long
    the safe point holds after a gap in the events topic that may hide a service hold (``core/gaps.py``)."""
    control_keys: str = field(default="", repr=False)
    """The keys that sign the cluster's control events, comma-separated (empty: control events are
    not signed); the first signs, every one is accepted (two while a key is rotated). A secret
    (``core/signing.py``)."""
    node_key_secret: str = field(default="", repr=False)
    """With it, every node event of the cluster must be signed by the node it names, with the key
    derived from this secret for that node (``core/signing.py``; empty: node events are not
    signed). A secret."""
    directive_keys: str = field(default="", repr=False)
    """The Ed25519 private keys (64 hex digits each, comma-separated; empty: directives are not signed)
    that sign the cluster's directives: the first signs; nodes verify with the public keys
    (``core/signing.py``). A secret."""
    generation: str = ""
    """The id of the job's state's lifetime, carried by every directive (empty: none, as replay has by
    default): made when the job starts on empty state and kept in its checkpoint, so that a node tells a
    job that lost everything from a forged or stale directive (``connectors/listener.py``). Set by
    the job, not a setting."""
    control_on_events_topic: bool = False
    """Accept control events found on the events topic (old publishers that predate the control topic).
    Off: they are refused (``core/origin.py``), since every node may write the events topic."""
    control_signature_window_ms: int = 300_000
    """A signed control event whose ``wall_ms`` lies further than this from its log time is refused
    (``stale_signature``): a signed event sent again later cannot act twice (0: no window)."""
    incarnation_grace_ms: int = 5_000
    """After a node's newer incarnation appeared, the older one's readers and transactions stay held
    until it has been silent this long (log time): a restart frees a dead process's holds within a few
    heartbeats, and a process that still speaks keeps them (``core/incarnations.py``)."""
    directive_interval_ms: int = 0
    """Least cluster time between two compaction directives of one cluster (0: every advance)."""
    max_message_bytes: int = 1_048_576
    """Input messages larger than this go to the dead-letter topic."""
    # -- a node's clock against the log's time (``core/clock.py``) ----------------------------------
    max_clock_skew_ms: int = 10_000
    """A node whose ``wall_ms`` stays further than this from its messages' log time (the broker's append
    time) for ``clock_skew_window_ms`` is alerted (``clock_skew``; 0: never)."""
    clock_skew_window_ms: int = 10_000
    """How long (log time) the offset must stay beyond, or back within, ``max_clock_skew_ms``."""

    # -- pressure bands on a node's pinned_bytes (NornicDB defaults; free space is not known
    #    to the job, so the absolute floors of its max(...) are the defaults) --------------------
    pinned_warning_enter_bytes: int = 5 * GIB
    pinned_warning_exit_bytes: int = 4 * GIB
    """0.8 x the enter threshold."""
    pinned_critical_enter_bytes: int = 20 * GIB
    pinned_critical_exit_bytes: int = 16 * GIB
    band_enter_window_ms: int = 30_000
    """A band is entered after a breach sustained this long (node clock)."""
    band_exit_window_ms: int = 120_000
    """A band is left after a recovery sustained this long (node clock)."""
    # -- age of the oldest live reader or transaction on a node ------------------------------
    reader_age_warning_ms: int = 600_000
    reader_age_critical_ms: int = 3_600_000
    # -- the cluster's safe point not advancing while cluster time moves on ------------------
    stall_ms: int = 600_000
    # -- prepared transactions undecided for too long ------------------------------------------
    in_doubt_timeout_ms: int = 60_000
    # -- forced expiry under sustained critical pinned-bytes pressure -------------------------
    expire_enabled: bool = True
    expire_after_ms: int = 60_000
    """Critical pressure must have lasted this long before any expiry."""
    max_reader_lifetime_ms: int = 300_000
    """Only readers and transactions open longer than this are expired."""
    expire_grace_ms: int = 30_000
    """A graceful expiry becomes hard if the reader is still open after this."""
    max_expiries_per_window: int = 5
    """At most this many expire directives per node in any expire_window_ms."""
    expire_window_ms: int = 60_000
    # -- predictive pressure (``core/pressure.py``) --------------------------------------------------
    forecast_horizon_ms: int = 900_000
    """Raise ``pressure_forecast`` when a node's pinned bytes, at their recent rate of growth, reach
    the critical threshold within this much time (node clock; 0: off)."""
    forecast_window_ms: int = 300_000
    """The growth rate is fitted over the heartbeats of this last stretch of the node's clock."""
    # -- emergency mode (``core/emergency.py``) ---------------------------------------------------
    emergency_exit_ms: int = 60_000
    """A cluster in emergency (a node in the critical band whose debt keeps growing) leaves it once no
    node has been so for this long of cluster time (0: emergency mode off)."""
    emergency_compaction_budget: int = 4
    """In emergency, directives tell nodes they may raise their compaction budget up to this many times
    their normal one (the ceiling; 1: no change)."""
    # -- tenants (``core/tenants.py``) -------------------------------------------------------------
    max_namespaces: int = 64
    """Namespaces with their own bound per cluster; holds of further namespaces pin all namespaces."""
    # -- leaked holds (``core/leaks.py``) --------------------------------------------------------
    leak_window_ms: int = 60_000
    """The job holding more readers or transactions than a node reports this long (node clock) is a leak (0: off)."""
    # -- the status (``core/status.py``) --------------------------------------------------------
    status_holds: int = 20
    """Oldest readers and transactions of each node kept in the status (0: no status at all)."""
    status_nodes: int = 100
    """Nodes whose lease and minimum the cluster's status record lists: those with a problem first,
    then the lowest minimums (the rest are filled in from their own records); bounds its size. The
    record goes out every micro-batch: at 1,000 nodes, listing all took 160 ms of a 1,076 ms batch."""
    mvcc_unit: str = "none"
    """What the cluster's MVCC timestamps count (``MVCC_UNITS``): its status says so, and every screen
    shows its safe point and lags in it."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SECRET_FIELDS or f.name in JOB_FIELDS:
                if not isinstance(value, str):
                    msg = f"policy key {f.name} must be a string"
                    raise ValueError(msg)
                continue
            if f.name in _STR_FIELDS:
                if value not in MVCC_UNITS:
                    msg = f"policy key {f.name} must be one of {', '.join(MVCC_UNITS)}, got {value!r}"
                    raise ValueError(msg)
                continue
            if f.name in _BOOL_FIELDS:
                if not isinstance(value, bool):
                    msg = f"policy key {f.name} must be true or false, got {value!r}"
                    raise ValueError(msg)
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                msg = f"policy key {f.name} must be an integer, got {value!r}"
                raise ValueError(msg)
            if value < 0:
                msg = f"policy key {f.name} must be >= 0, got {value}"
                raise ValueError(msg)
        if not all(_is_key(k) for k in self.directive_keys.split(",") if k.strip()):
            msg = ("policy key directive_keys must be Ed25519 private keys, 64 hex digits each, comma-separated "
                   "(safepoint directive-key makes one)")
            raise ValueError(msg)
        if self.emergency_compaction_budget < 1:
            msg = "policy key emergency_compaction_budget must be >= 1 (a multiple of the normal budget)"
            raise ValueError(msg)
        if self.node_lease_ms == 0:
            msg = "policy key node_lease_ms must be > 0"
            raise ValueError(msg)
        for enter, exit_ in (
            ("pinned_warning_enter_bytes", "pinned_warning_exit_bytes"),
            ("pinned_critical_enter_bytes", "pinned_critical_exit_bytes"),
        ):
            if getattr(self, exit_) > getattr(self, enter):
                msg = f"policy key {exit_} must not exceed {enter} (hysteresis: exit below enter)"
                raise ValueError(msg)
        if self.pinned_critical_enter_bytes < self.pinned_warning_enter_bytes:
            msg = "policy key pinned_critical_enter_bytes must be >= pinned_warning_enter_bytes"
            raise ValueError(msg)
        if self.reader_age_critical_ms < self.reader_age_warning_ms:
            msg = "policy key reader_age_critical_ms must be >= reader_age_warning_ms"
            raise ValueError(msg)

    @property
    def directive_signer(self) -> str | None:
        """The private key that signs the cluster's directives (the first of ``directive_keys``), or None."""
        keys = [k.strip() for k in self.directive_keys.split(",") if k.strip()]
        return keys[0] if keys else None

    @property
    def signing_keys(self) -> list[str]:
        """``control_keys`` as a list (empty: control events are not signed)."""
        return [k.strip() for k in self.control_keys.split(",") if k.strip()]

    def pinned_band(self) -> BandSpec:
        return _band(
            self.pinned_warning_enter_bytes,
            self.pinned_warning_exit_bytes,
            self.pinned_critical_enter_bytes,
            self.pinned_critical_exit_bytes,
            self.band_enter_window_ms,
            self.band_exit_window_ms,
        )

    def age_band(self) -> BandSpec:
        """Age only grows while the reader lives and drops when it closes: no debounce needed."""
        return _band(
            self.reader_age_warning_ms,
            self.reader_age_warning_ms,
            self.reader_age_critical_ms,
            self.reader_age_critical_ms,
            0,
            0,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Policy:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _is_key(text: str) -> bool:
    """64 hex digits: an Ed25519 key's 32 bytes."""
    text = text.strip()
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


@lru_cache(maxsize=64)
def _band(*spec: int) -> BandSpec:
    """One BandSpec per distinct thresholds (asked for on every node event)."""
    return BandSpec(*spec)


class Policies:
    """The policy of each cluster a job serves: one job serves clusters of several engines, each with
    its own retention, unit, thresholds and windows (``[clusters.NAME]`` tables of the settings), and
    every other cluster the default."""

    __slots__ = ("default", "clusters")

    def __init__(self, default: Policy | None = None, clusters: dict[str, Policy] | None = None) -> None:
        self.default = default or Policy()
        self.clusters: dict[str, Policy] = dict(clusters or {})

    def of(self, cluster: str) -> Policy:
        """The policy cluster ``cluster`` runs on."""
        return self.clusters.get(cluster, self.default) if self.clusters else self.default

    def to_dict(self) -> dict[str, Any]:
        return {"default": self.default.to_dict(), "clusters": {c: p.to_dict() for c, p in sorted(self.clusters.items())}}

    def with_generation(self, generation: str) -> Policies:
        """These policies with the job's ``generation`` in every cluster's (``Policy.generation``)."""
        return Policies(replace(self.default, generation=generation),
                        {name: replace(p, generation=generation) for name, p in self.clusters.items()})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Policies:
        """From ``to_dict`` (or a single policy's dict: the default of every cluster)."""
        if "default" not in data:
            return cls(Policy.from_dict(data))
        return cls(Policy.from_dict(data["default"]),
                   {c: Policy.from_dict(p) for c, p in (data.get("clusters") or {}).items()})

    @classmethod
    def of_policy(cls, policy: Policy | Policies | None) -> Policies:
        return policy if isinstance(policy, Policies) else cls(policy)

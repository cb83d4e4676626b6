"""One typed settings object per process: defaults < TOML file < SAFEPOINT_* environment < flags."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypedDict

from safepoint.core.policy import JOB_FIELDS, MVCC_UNITS, Policies, Policy
from safepoint.errors import ConfigError

__all__ = ["Settings", "Secret", "JvmChoices", "ENV_PREFIX", "load_settings", "env_name"]

ENV_PREFIX = "SAFEPOINT_"
_P = Policy()
POLICY_KEYS = tuple(f.name for f in fields(Policy) if f.name not in JOB_FIELDS)
_SECRET_HINTS = ("password", "secret", "token", "key.pem", "keystore")


class Secret(str):
    """A string that never shows itself in logs or reprs."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Secret('********')"

    def get(self) -> str:
        return str.__str__(self)


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper().replace("-", "_").replace(".", "_")


class JvmChoices(TypedDict):
    """``build_session``'s keywords for the JVM a command starts (``Settings.jvm``)."""

    jit: str
    driver_memory: str
    gc: str


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a safepoint process can be told. Field names are the TOML keys and flags."""

    bootstrap: str = "127.0.0.1:9092"
    checkpoint: str = ""
    events_topic: str = "safepoint.events"
    control_topic: str = "safepoint.control"
    """Service holds, releases, pause, resume and gap acknowledgements: the operators' and holders' topic."""
    directives_topic: str = "safepoint.directives"
    alerts_topic: str = "safepoint.alerts"
    deadletter_topic: str = "safepoint.deadletter"
    status_topic: str = "safepoint.status"
    """Compacted topic of the status (what pins history), keyed by cluster and cluster/node; empty: no status."""
    accounting_topic: str = ""
    """If set, the job also writes every input offset's outcome there (applied, ignored:<why>, deadlettered:<class>)."""
    events_partitions: int = 4
    """Partitions of the events topic when the job creates it."""
    trigger_ms: int = 250
    """Micro-batch trigger interval (processing time)."""
    max_offsets_per_trigger: int = 200_000
    """Most input messages one micro-batch reads, over all partitions."""
    first_batch_max_offsets: int = 10_000
    """Most input messages the first micro-batch of a run reads, when lower (the Python source):
    a start or restart on a backlog answers after a small batch, whose time is mostly Spark's and
    the workers' warming up, then reads ``max_offsets_per_trigger`` at a time; 0: no cap of its own."""
    read_task_min_rows: int = 10_000
    """A micro-batch is read by one task per this many messages, at most one task per events
    partition (the Python source; 0: always one task per partition with messages). A read task has
    a fixed cost (scheduling, a Python worker's turn, a consumer's assign and first fetch), so small
    batches read in one task."""
    starting_offsets: str = "earliest"
    """Where a new query (no checkpoint yet) starts: earliest or latest."""
    source_format: str = "python"
    """python: the built-in Python Data Source (no jars); kafka: Spark's own connector (needs its jar)."""
    shuffle_partitions: int = 1
    """spark.sql.shuffle.partitions: how many tasks the stateful operator spreads its clusters over
    (fixed per checkpoint by Spark). Every task loads and commits a state store each batch, so one
    cluster wants 1 (measured on local[2], steady batches of one cluster: the state commit 130 -> 45
    ms, the batch 720-780 -> 640-750 ms); a job serving several clusters wants about the executor
    cores."""
    node_buckets: int = 8
    """The map entries a cluster's node state is split into (crc32(node) % node_buckets): a batch reads
    and writes only the buckets it touches; fixed per checkpoint."""
    mvcc_unit: str = "none"
    """The unit of MVCC timestamps, for screens: ns, us, ms or s shows safe points as times and lags
    in seconds; counter (or none: an opaque counter) shows the numbers."""
    jvm_jit: str = "c1"
    """How Spark's JVMs compile: c1 (the quick compiler only; on 2 cores the optimizing one took
    most of the JVM's CPU in a query's first minute, for a JVM that does a tenth of the job's work)
    or tiered (the JVM's default, for executors with cores to spare over a long run)."""
    jvm_gc: str = "serial"
    """How the JVM the job starts for itself collects its garbage: serial (one collector thread,
    ``-XX:+UseSerialGC``; on 2 cores the benchmark's JVM held about 180 MB less resident memory than
    with G1, its batches as fast) or default (the JVM's own choice: G1 on a machine with 2 or more
    cores and 2 GB). Executors on a cluster keep the JVM's choice."""
    driver_memory: str = "1g"
    """The heap of the JVM the job starts for itself (``spark.driver.memory``: the driver, and with a
    local master the executors in it); under spark-submit pass ``--driver-memory``. The state lives
    in RocksDB outside the heap and a batch is at most ``max_offsets_per_trigger`` messages: 1g
    served the bench's 10,000-node run as fast as 2g with about 100 MB less resident memory."""
    spark_ui: bool = False
    """Serve Spark's web UI (its address is printed at start); off by default and in tests."""
    spark_master: str = "local[2]"
    """Spark master URL; "submit" (or empty) takes the one spark-submit was given."""
    retention: int = 0
    node_lease_ms: int = 30_000
    incarnation_grace_ms: int = _P.incarnation_grace_ms
    max_service_hold_ttl_ms: int = _P.max_service_hold_ttl_ms
    control_keys: str = ""
    node_key_secret: str = ""
    directive_keys: str = ""
    directive_key: str = ""
    """The public keys a node, an agent or a listener verifies directives with (64 hex digits each,
    comma-separated during a rotation; empty: directives are taken unsigned): the job's
    ``directive_keys``' public halves (``safepoint directive-key``)."""
    control_signature_window_ms: int = _P.control_signature_window_ms
    control_on_events_topic: bool = _P.control_on_events_topic
    directive_interval_ms: int = 0
    max_message_bytes: int = 1_048_576
    max_clock_skew_ms: int = _P.max_clock_skew_ms
    clock_skew_window_ms: int = _P.clock_skew_window_ms
    pinned_warning_enter_bytes: int = _P.pinned_warning_enter_bytes
    pinned_warning_exit_bytes: int = _P.pinned_warning_exit_bytes
    pinned_critical_enter_bytes: int = _P.pinned_critical_enter_bytes
    pinned_critical_exit_bytes: int = _P.pinned_critical_exit_bytes
    band_enter_window_ms: int = _P.band_enter_window_ms
    band_exit_window_ms: int = _P.band_exit_window_ms
    reader_age_warning_ms: int = _P.reader_age_warning_ms
    reader_age_critical_ms: int = _P.reader_age_critical_ms
    stall_ms: int = _P.stall_ms
    in_doubt_timeout_ms: int = _P.in_doubt_timeout_ms
    expire_enabled: bool = _P.expire_enabled
    expire_after_ms: int = _P.expire_after_ms
    max_reader_lifetime_ms: int = _P.max_reader_lifetime_ms
    expire_grace_ms: int = _P.expire_grace_ms
    max_expiries_per_window: int = _P.max_expiries_per_window
    expire_window_ms: int = _P.expire_window_ms
    status_holds: int = _P.status_holds
    status_nodes: int = _P.status_nodes
    leak_window_ms: int = _P.leak_window_ms
    forecast_horizon_ms: int = _P.forecast_horizon_ms
    forecast_window_ms: int = _P.forecast_window_ms
    emergency_exit_ms: int = _P.emergency_exit_ms
    emergency_compaction_budget: int = _P.emergency_compaction_budget
    max_namespaces: int = _P.max_namespaces
    http_port: int = 0
    """Serve the status API, metrics and dashboard on this port (0: off)."""
    http_host: str = "127.0.0.1"
    """Address the HTTP surface binds (loopback unless told otherwise)."""
    admin_token: str = ""
    admin_tokens: str = ""
    """Named bearer tokens of the HTTP surface's POST actions, ``name:token`` comma-separated (a
    secret): each action is recorded with the name of whoever sent it."""
    """Bearer token the HTTP surface's POST actions require (a ``Secret``: never printed); empty: every POST is 403."""
    http_tls_certfile: str = ""
    """PEM certificate chain: the HTTP surface serves HTTPS (with ``http_tls_keyfile``); empty: plain HTTP."""
    http_tls_keyfile: str = ""
    """The certificate's PEM private key."""
    client: str = "confluent"
    """The node client's Kafka library (Reporter, DirectiveListener): confluent (librdkafka) or
    kafka-python (pure Python, for nodes without librdkafka's wheel). The job always uses confluent-kafka."""
    kafka: dict[str, Any] = field(default_factory=dict)
    """Extra librdkafka settings (security.protocol, sasl.*, ssl.*), passed to every client."""
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-cluster policy: ``[clusters.NAME]`` tables of the TOML file, with the policy keys of the top
    level (``retention``, ``mvcc_unit``, thresholds, windows); the top level is every other cluster's."""

    def policy(self) -> Policy:
        """The default policy: every cluster's that has no ``[clusters.NAME]`` table."""
        values = {name: getattr(self, name) for name in POLICY_KEYS}
        if not self.status_topic:
            values["status_holds"] = 0  # no status topic: the stages build no status
        return Policy(**values)

    def policies(self) -> Policies:
        """Each cluster's policy: the default, and a cluster's own table over it."""
        default = self.policy()
        clusters = {}
        for name, table in self.clusters.items():
            try:
                clusters[name] = replace(default, **table)
            except ValueError as exc:
                msg = f"[clusters.{name}]: {exc}"
                raise ValueError(msg) from exc
        return Policies(default, clusters)

    def jvm(self) -> JvmChoices:
        """The JVM choices of ``build_session`` (``streaming/session.py``) for the JVM a command
        starts: its compiler, heap and garbage collector."""
        return {"jit": self.jvm_jit, "driver_memory": self.driver_memory, "gc": self.jvm_gc}

    def librdkafka(self, **extra: Any) -> dict[str, Any]:
        """The dotted librdkafka configuration for a client of this deployment."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        for k, v in self.kafka.items():
            conf[k] = v.get() if isinstance(v, Secret) else v
        conf.update(extra)
        return conf

    def topics(self) -> dict[str, str]:
        return {
            "events": self.events_topic,
            "control": self.control_topic,
            "directives": self.directives_topic,
            "alerts": self.alerts_topic,
            "deadletter": self.deadletter_topic,
            "accounting": self.accounting_topic,
            "status": self.status_topic,
        }

    def with_overrides(self, **values: Any) -> Settings:
        return replace(self, **{k: v for k, v in values.items() if v is not None})


_FIELDS = {f.name: f for f in fields(Settings)}


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _coerce(name: str, raw: Any, source: str = "") -> Any:
    """``raw`` as the type of setting ``name``, as strictly for the TOML file and the environment as
    for flags: a wrong type or an unknown word is an error naming the key and where it came from."""
    default = getattr(Settings(), name)
    where = f"{name} ({source})" if source else name
    if name == "clusters":
        if not isinstance(raw, dict) or not all(isinstance(t, dict) for t in raw.values()):
            msg = f'setting {where} must be tables of policy keys, e.g. [clusters.etcd-main] mvcc_unit = "revision"'
            raise ConfigError(msg)
        out: dict[str, dict[str, Any]] = {}
        for cluster, table in raw.items():
            unknown = sorted(set(table) - set(POLICY_KEYS))
            if unknown:
                msg = (f"[clusters.{cluster}] ({source}) sets {', '.join(unknown)}, which a cluster cannot have of its own; "
                       f"its keys are the policy's: {', '.join(sorted(POLICY_KEYS))}")
                raise ConfigError(msg)
            out[cluster] = {k: _coerce(k, v, f"[clusters.{cluster}] {source}".strip()) for k, v in table.items()}
        return out
    if name == "kafka":
        if not isinstance(raw, dict):
            msg = f'setting {where} must be a table of librdkafka keys, e.g. [kafka] "security.protocol" = "SASL_SSL"'
            raise ConfigError(msg)
        return {k: Secret(v) if any(h in k for h in _SECRET_HINTS) and isinstance(v, str) else v for k, v in raw.items()}
    if isinstance(default, bool):
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in TRUE_WORDS + FALSE_WORDS:
            return raw.strip().lower() in TRUE_WORDS
        msg = f"setting {where} must be true or false ({'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}), got {raw!r}"
        raise ConfigError(msg)
    if isinstance(default, int):
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
            value = int(raw.strip())
        if value is None:
            msg = f"setting {where} must be an integer, got {raw!r}"
            raise ConfigError(msg)
        return value
    if not isinstance(raw, str):
        msg = f"setting {where} must be a string, got {raw!r}"
        raise ConfigError(msg)
    return Secret(raw) if name in ("admin_token", "admin_tokens", "control_keys", "node_key_secret",
                                   "directive_keys") else raw


RETIRED = {
    "fast_path": "the job has one path (it packs each micro-batch per cluster and node bucket); delete the line",
}
"""Settings that existed once, with what to do about them."""


def load_settings(
    config: str | os.PathLike[str] | None = None,
    flags: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    """Merge defaults, the TOML file, the environment and the flags (later wins)."""
    env = os.environ if environ is None else environ
    config = config or env.get(env_name("config")) or None
    values: dict[str, Any] = _from_toml(Path(config)) if config else {}
    for name in _FIELDS:
        if name in ("kafka", "clusters"):
            continue
        raw = env.get(env_name(name))
        if raw is not None and raw != "":
            values[name] = _coerce(name, raw, f"environment variable {env_name(name)}")
    for name, raw in (flags or {}).items():
        if raw is not None and name in _FIELDS:
            values[name] = _coerce(name, raw, f"flag --{name.replace('_', '-')}")
    try:
        settings = Settings(**values)
        settings.policies()
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    _check_choices(settings)
    return settings


def _from_toml(path: Path) -> dict[str, Any]:
    """The settings of a TOML file (its ``alerts`` and ``policy`` tables are other modules')."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        msg = f"config file {path} not found"
        raise ConfigError(msg) from exc
    except tomllib.TOMLDecodeError as exc:
        msg = f"config file {path} is not valid TOML: {exc}"
        raise ConfigError(msg) from exc
    values: dict[str, Any] = {}
    for k, v in data.items():
        if k not in _FIELDS:
            if k in ("alerts", "policy"):
                continue  # tables other modules read
            if k in RETIRED:
                msg = f"setting {k!r} in {path} was removed: {RETIRED[k]}"
                raise ConfigError(msg)
            msg = f"unknown setting {k!r} in {path}; known: {', '.join(sorted(_FIELDS))}"
            raise ConfigError(msg)
        values[k] = _coerce(k, v, f"in {path}")
    return values


_EITHER = {"source_format": ("python", "kafka"), "jvm_jit": ("c1", "tiered"), "jvm_gc": ("serial", "default"),
           "client": ("confluent", "kafka-python"),
           "starting_offsets": ("earliest", "latest")}
"""The settings that take one of two values."""


def _check_choices(settings: Settings) -> None:
    """Settings that take one of a few values, or a least one."""
    for name, (one, other) in _EITHER.items():
        value = getattr(settings, name)
        if value not in (one, other):
            msg = f"{name} must be {one!r} or {other!r}, got {value!r}"
            raise ConfigError(msg)
    if settings.node_buckets < 1:
        msg = f"node_buckets must be at least 1, got {settings.node_buckets}"
        raise ConfigError(msg)
    for name in ("read_task_min_rows", "first_batch_max_offsets"):
        if getattr(settings, name) < 0:
            msg = f"{name} must be 0 or more, got {getattr(settings, name)}"
            raise ConfigError(msg)
    if not re.fullmatch(r"[1-9][0-9]*[kmgt]?", settings.driver_memory.lower()):
        msg = f"driver_memory must be a JVM memory size such as 1g or 1536m, got {settings.driver_memory!r}"
        raise ConfigError(msg)
    if settings.mvcc_unit not in MVCC_UNITS:
        msg = f"mvcc_unit must be one of {', '.join(MVCC_UNITS)}, got {settings.mvcc_unit!r}"
        raise ConfigError(msg)

"""The streaming query: events in, directives and alerts out.

    safepoint_kafka source, the Router in its read tasks     (streaming/source.py)
      (or Spark's kafka source, then the Router as a mapInArrow)
    -> group by cluster -> ClusterJob                          (streaming/processors.py ->
                                                                 core/batch.py run_batch)
       which produces its outputs when its task ends           (streaming/kafka_sink.py deliver)
    -> noop sink (Spark's kafka format: Spark's Kafka sink writes the (topic, key, value) rows)

``ClusterJob`` is the one stateful operator (``transformWithState`` on the RocksDB state store);
the rules it runs live in the pure core: ``run_batch`` runs ``engine.step``, replay's own loop,
over each cluster's messages in log order.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from safepoint.core.batch import METRICS
from safepoint.core.recovery import StartPlan
from safepoint.errors import ConfigError
from safepoint.settings import Settings
from safepoint.streaming.checkpoint import check_checkpoint, has_committed_batch, job_generation
from safepoint.streaming.processors import OUTPUT_SCHEMA, ROUTED_SCHEMA, SINK_COLUMNS, ClusterJob, Router, origins

__all__ = ["build_query", "batch_accounting", "gaps_in", "messages_in", "read_events", "QUERY_NAME", "kafka_connector_missing",
           "kafka_options"]

log = logging.getLogger(__name__)
QUERY_NAME = "safepoint"


KAFKA_CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def kafka_connector_missing(spark: Any) -> str | None:
    """None when Spark's own Kafka connector is on the classpath, else what to do."""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(
            KAFKA_CONNECTOR_CLASS, True, spark.sparkContext._jvm.Thread.currentThread().getContextClassLoader()
        )
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        from safepoint.streaming.session import KAFKA_CONNECTOR

        return (
            f"Spark's Kafka connector ({KAFKA_CONNECTOR_CLASS}) is not on the classpath: submit with "
            f"--packages {KAFKA_CONNECTOR}:{spark.version}, or use source_format = \"python\""
        )
    return None


def require_kafka_connector(spark: Any) -> None:
    why = kafka_connector_missing(spark)
    if why:
        raise ConfigError(why)


ACCOUNTING = "accounting"


def batch_accounting(progress: Any) -> dict[str, int]:
    """A batch's accounting counters (consumed, applied, ignored_<why>, deadlettered_<class>) from
    its progress (a StreamingQueryProgress or its dict); {} if the batch reported none."""
    metrics = getattr(progress, "observedMetrics", None)
    if metrics is None and hasattr(progress, "get"):
        metrics = progress.get("observedMetrics")
    row = (metrics or {}).get(ACCOUNTING)
    if row is None:
        return {}
    data = row.asDict() if hasattr(row, "asDict") else dict(row)
    return {k: int(v or 0) for k, v in data.items()}


def gaps_in(progress: dict[str, Any]) -> list[dict[str, Any]]:
    """The gaps the source found in the events topic so far (``core/gaps.py``), from a batch's progress:
    the Python source keeps them in its offset."""
    out: list[dict[str, Any]] = []
    for src in progress.get("sources") or []:
        raw = src.get("endOffset")
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                continue
        if isinstance(raw, dict) and isinstance(raw.get("gaps"), list):
            out += [g for g in raw["gaps"] if isinstance(g, dict)]
    return out


def messages_in(progress: Any) -> int:
    """Input messages of a batch. Use this, not ``numInputRows``: with the Python source, the
    source hands Spark packed rows (one per cluster and node bucket), so Spark's
    ``numInputRows`` counts those; the accounting counter ``consumed`` counts messages."""
    acct = batch_accounting(progress)
    if "consumed" in acct:
        return acct["consumed"]
    rows = progress["numInputRows"] if hasattr(progress, "__getitem__") else getattr(progress, "numInputRows", 0)
    return int(rows or 0)


def accounting_metrics() -> list[Any]:
    """Per-batch counters of every message's outcome (the query's observedMetrics["accounting"]),
    summed over the operator's rows, which carry them as columns."""
    from pyspark.sql import functions as F

    return [F.coalesce(F.sum(m), F.lit(0)).alias(m) for m in METRICS]


def kafka_options(settings: Settings, builtin: bool) -> dict[str, str]:
    opts: dict[str, str] = {}
    prefix = "kafka."
    opts[(prefix if builtin else "") + "bootstrap.servers"] = settings.bootstrap
    for k, v in settings.librdkafka().items():
        if k == "bootstrap.servers":
            continue
        opts[prefix + k] = str(v)
    return opts


def read_events(spark: Any, settings: Settings, pack: dict[str, Any] | None = None) -> Any:
    """The raw input of the events and the control topics: topic, partition, offset, key, value (binary)
    and the record's broker time (``timestamp``,
    ms; null when the topic keeps the producers' times). With ``pack`` (the Python source; the
    policy as a dict) the source routes and packs in its read tasks and returns routed rows
    (cluster, blob) instead."""
    from safepoint.streaming.source import pack_options

    builtin = settings.source_format == "kafka"
    reader = spark.readStream.format("kafka" if builtin else "safepoint_kafka")
    for k, v in kafka_options(settings, builtin).items():
        reader = reader.option(k, v)
    if pack is not None:
        if builtin:
            msg = "only the Python source (source_format = \"python\") packs in its read tasks"
            raise ConfigError(msg)
        for k, v in pack_options(pack).items():
            reader = reader.option(k, v)
    if not builtin:
        reader = reader.option("minRowsPerTask", str(settings.read_task_min_rows))
        reader = reader.option("maxOffsetsFirstTrigger", str(settings.first_batch_max_offsets))
    if builtin:
        reader = reader.option("subscribe", f"{settings.events_topic},{settings.control_topic}")
    else:
        reader = reader.option("subscribe", settings.events_topic).option("controlTopic", settings.control_topic)
    reader = (
        reader
        .option("startingOffsets", settings.starting_offsets)
        .option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
    )
    if builtin:  # the records' headers too: a node client names its event's cluster in one (core/batch.py)
        reader = reader.option("failOnDataLoss", "true").option("includeHeaders", "true")
    if pack is not None:
        return reader.load()
    raw = reader.load()
    if builtin:  # Spark's kafka source: a timestamp column and its type (1: LogAppendTime)
        from pyspark.sql import functions as F

        broker = F.when(F.col("timestampType") == 1, F.unix_millis(F.col("timestamp")))
        return raw.select("topic", "partition", "offset", "key", "value", broker.alias("timestamp"), "headers")
    return raw.select("topic", "partition", "offset", "key", "value", "timestamp")


def _route_in_spark(raw: Any, settings: Settings, policy: dict[str, Any], start: dict[str, Any] | None = None) -> Any:
    """Routed rows from raw Kafka rows through a mapInArrow router (the Python source routes in its
    own read tasks instead, see build_query), then the operator of ``_stateful_stage``. Spark's
    kafka source gives the records' headers too, and the router reads the cluster's there."""
    from pyspark.sql import functions as F

    routed_df = raw.select(
        F.col("topic").cast("string").alias("topic"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.col("key").cast("binary").alias("key"),
        F.col("value").cast("binary").alias("value"),
        F.col("timestamp").cast("long").alias("timestamp"),
        *(["headers"] if "headers" in raw.columns else []),
    ).mapInArrow(Router(policy, origins(settings.events_topic, settings.control_topic)), ROUTED_SCHEMA)
    return _stateful_stage(routed_df, settings, policy, start)


def _stateful_stage(routed: Any, settings: Settings, policy: dict[str, Any], start: dict[str, Any] | None = None) -> Any:
    """Group by cluster -> ClusterJob (no timers, append) -> the accounting counters observed from
    its counter rows, which are then dropped -> the sink's columns. With the Python source the
    operator produces its outputs itself (``produce_in_operator``) and only counter rows come out."""
    from pyspark.sql import functions as F

    produce = kafka_options(settings, builtin=False) if produce_in_operator(settings) else None
    job = ClusterJob(policy, settings.node_buckets, settings.topics(), settings.accounting_topic, start, produce)
    rows = routed.groupBy("cluster").transformWithState(
        statefulProcessor=job, outputStructType=OUTPUT_SCHEMA, outputMode="Append", timeMode="None"
    )
    rows = rows.observe(ACCOUNTING, *accounting_metrics())
    return rows.where(F.col("topic") != "").select(*SINK_COLUMNS)


def produce_in_operator(settings: Settings) -> bool:
    """Whether ``ClusterJob`` produces to Kafka itself, behind a ``noop`` sink: with the Python
    source (``source_format = "python"``). Its outputs then skip a second Python worker per task
    (the sink's writer), the trip through the JVM to reach it and the sink's planning workers;
    Spark's ``kafka`` format keeps Spark's own Kafka sink."""
    return settings.source_format == "python"


def start_plan(spark: Any, settings: Settings, checkpoint: str) -> StartPlan | None:
    """None when the checkpoint has committed state; else how the clusters start (a start on
    empty state: seeded from the directives topic, recovering; see core/recovery.py)."""
    if has_committed_batch(spark, checkpoint):
        return None
    from safepoint.connectors.kafka.seeds import read_seeds
    from safepoint.core.signing import public_key_of

    policies = settings.policies()

    def public_keys(cluster: str) -> list[str]:  # every key listed: a directive of the key rotated out still seeds
        return [public_key_of(k) for k in policies.of(cluster).directive_keys.split(",") if k.strip()]

    seeds = read_seeds(settings.librdkafka(), settings.directives_topic, public_keys=public_keys)
    plan = StartPlan(seeds, recover_all=settings.starting_offsets != "earliest")
    if plan.seeds or plan.recover_all:
        log.warning(
            "starting on empty state (checkpoint %s has no committed batch): %s; every node of %s must send a "
            "snapshot (asked with a snapshot_request directive) before the round counts it again",
            checkpoint,
            f"{len(seeds)} cluster(s) seeded from {settings.directives_topic}" if seeds else "no directive to seed from",
            "every cluster" if plan.recover_all else "the seeded clusters",
        )
    return plan


def build_query(spark: Any, settings: Settings, checkpoint: str | None = None, pack_in_source: bool = True) -> Any:
    """Start the streaming query and return it. ``pack_in_source=False`` routes in a separate
    mapInArrow even with the Python source, as it must with Spark's ``kafka`` format
    (tests use it to run that plan here, where the connector jar is absent)."""

    from safepoint.streaming.source import PackingKafkaDataSource

    if settings.source_format == "python":
        spark.dataSource.register(PackingKafkaDataSource)
    else:
        require_kafka_connector(spark)
    checkpoint = checkpoint or settings.checkpoint
    if not checkpoint:
        msg = "the job needs a checkpoint directory (--checkpoint)"
        raise ValueError(msg)
    check_checkpoint(spark, settings, checkpoint)
    plan = start_plan(spark, settings, checkpoint)
    generation = job_generation(spark, checkpoint, fresh=plan is not None)
    log.info("the job's generation: %s%s", generation, " (new: a start on empty state)" if plan is not None else "")
    policy = settings.policies().with_generation(generation).to_dict()
    start = plan.to_json() if plan is not None else None
    if settings.source_format == "python" and pack_in_source:
        outputs = _stateful_stage(read_events(spark, settings, policy), settings, policy, start)
    else:
        outputs = _route_in_spark(read_events(spark, settings), settings, policy, start)
    if produce_in_operator(settings):
        writer = outputs.writeStream.format("noop").queryName(QUERY_NAME)
    else:
        writer = outputs.writeStream.format("kafka").queryName(QUERY_NAME)
        for k, v in kafka_options(settings, builtin=True).items():
            writer = writer.option(k, v)
    return (
        writer.option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(processingTime=f"{settings.trigger_ms} milliseconds")
        .start()
    )

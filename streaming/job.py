"""The streaming job: events in, per-node state, per-cluster round, directives and alerts out.

Fast path (default, streaming/packed.py):
safepoint_kafka source with the Router in its read tasks (or Spark's kafka source -> Router as a
mapInArrow): parse, validate, pack per cluster and node bucket
-> group by (cluster, bucket) -> BucketProcessor (transformWithState, RocksDB) -> group by cluster
-> PackedClusterProcessor (transformWithState, RocksDB) -> sink (topic, key, value)

Plain path (fast_path = false, streaming/processors.py): one row per message,
from_json envelope (JVM) -> group by (cluster, node) -> NodeProcessor -> group by cluster
-> ClusterProcessor -> sink. Both run the same core and give the same outputs.
"""

from __future__ import annotations

import logging
from typing import Any

from safepoint.core.events import DEADLETTER_CODES, DEFAULT_CLUSTER
from safepoint.core.recovery import StartPlan
from safepoint.errors import ConfigError
from safepoint.schemas import NODE_EVENT_TYPES, load
from safepoint.settings import Settings
from safepoint.streaming.checkpoint import check_checkpoint, has_committed_batch
from safepoint.streaming.packed import (
    IGNORE_REASONS,
    METRICS,
    PACKED_ONE_SCHEMA,
    ROUTED_SCHEMA,
    BucketProcessor,
    PackedClusterProcessor,
    Router,
)
from safepoint.streaming.processors import OUTPUT_SCHEMA, STAGE_ONE_SCHEMA, ClusterProcessor, NodeProcessor

__all__ = ["build_query", "batch_accounting", "messages_in", "envelope_schema", "read_events", "QUERY_NAME", "kafka_connector_missing", "kafka_options"]

log = logging.getLogger(__name__)
QUERY_NAME = "safepoint"


def envelope_schema() -> Any:
    """The JVM-side routing fields, taken from the contract's schemas (strings: never fails)."""
    from pyspark.sql.types import StringType, StructField, StructType

    fields = ["type", "cluster", "node"]
    for name in fields:
        assert name in load("events", "reader_open")["properties"] or name == "node"
    return StructType([StructField(f, StringType(), True) for f in fields])


KAFKA_CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def kafka_connector_missing(spark: Any) -> str | None:
    """None when Spark's own Kafka connector is on the classpath, else what to do."""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(
            KAFKA_CONNECTOR_CLASS, True, spark.sparkContext._jvm.Thread.currentThread().getContextClassLoader()
        )
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        version = spark.version
        return (
            f"Spark's Kafka connector ({KAFKA_CONNECTOR_CLASS}) is not on the classpath: submit with "
            f"--packages org.apache.spark:spark-sql-kafka-0-10_2.13:{version}, or use source_format = \"python\""
        )
    return None


def require_kafka_connector(spark: Any) -> None:
    why = kafka_connector_missing(spark)
    if why:
        raise ConfigError(why)


ACCOUNTING = "accounting"


def accounting_metrics() -> list[Any]:
    """Per-batch counters of every message's outcome (the query's observedMetrics["accounting"])."""
    from pyspark.sql import functions as F

    def count(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0))

    outcome = F.col("outcome")
    metrics = [
        F.count(F.lit(1)).alias("consumed"),
        count(outcome == "applied").alias("applied"),
        count(outcome.startswith("ignored:")).alias("ignored"),
        count(outcome.startswith("deadlettered:")).alias("deadlettered"),
    ]
    metrics += [count(outcome == f"ignored:{r}").alias(f"ignored_{r}") for r in IGNORE_REASONS]
    metrics += [count(outcome == f"deadlettered:{c}").alias(f"deadlettered_{c}") for c in DEADLETTER_CODES]
    return metrics


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


def messages_in(progress: Any) -> int:
    """Input messages of a batch. Use this, not ``numInputRows``: on the fast path with the Python
    source, the source hands Spark packed rows (one per cluster and node bucket), so Spark's
    ``numInputRows`` counts those; the accounting counter ``consumed`` counts messages."""
    acct = batch_accounting(progress)
    if "consumed" in acct:
        return acct["consumed"]
    rows = progress["numInputRows"] if hasattr(progress, "__getitem__") else getattr(progress, "numInputRows", 0)
    return int(rows or 0)


def packed_metrics() -> list[Any]:
    """The same counters over the fast path's packed rows, which carry them as columns."""
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
    """The raw input: partition, offset, key, value (binary). With ``pack`` (the Python source on
    the fast path: {"policy": ..., "buckets": ...}) the source routes and packs in its read tasks
    and returns the fast path's routed rows (cluster, bucket, blob) instead."""
    import json

    from safepoint.connectors.kafka_source import PACK_OPTION

    builtin = settings.source_format == "kafka"
    reader = spark.readStream.format("kafka" if builtin else "safepoint_kafka")
    for k, v in kafka_options(settings, builtin).items():
        reader = reader.option(k, v)
    if pack is not None:
        if builtin:
            msg = "only the Python source (source_format = \"python\") packs in its read tasks"
            raise ConfigError(msg)
        reader = (reader.option(PACK_OPTION, "true").option("safepoint.policy", json.dumps(pack["policy"]))
                  .option("safepoint.buckets", str(pack["buckets"])))
    reader = (
        reader.option("subscribe", settings.events_topic)
        .option("startingOffsets", settings.starting_offsets)
        .option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
    )
    if builtin:
        reader = reader.option("failOnDataLoss", "true")
    if pack is not None:
        return reader.load()
    return reader.load().select("partition", "offset", "key", "value")


def _stateful(df: Any, keys: list[str], processor: Any, schema: Any) -> Any:
    """One transformWithState operator (no timers, append) grouped by ``keys``."""
    return df.groupBy(*keys).transformWithState(
        statefulProcessor=processor, outputStructType=schema, outputMode="Append", timeMode="None"
    )


def _plain_path(raw: Any, settings: Settings, policy: dict[str, Any], start: dict[str, Any] | None = None) -> Any:
    """One row per message: JVM envelope, group by (cluster, node), group by cluster."""
    from pyspark.sql import functions as F

    env = F.from_json(F.col("value").cast("string"), envelope_schema())
    keyed = raw.select(
        F.coalesce(env.getField("cluster"), F.when(env.isNotNull(), F.lit(DEFAULT_CLUSTER)), F.lit("")).alias("cluster"),
        F.when(env.getField("type").isin(*NODE_EVENT_TYPES), F.coalesce(env.getField("node"), F.lit("")))
        .otherwise(F.lit(""))
        .alias("node"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.col("key").cast("binary").alias("key"),
        F.col("value").cast("binary").alias("value"),
    )
    stage_one = _stateful(keyed, ["cluster", "node"], NodeProcessor(policy, settings.events_topic), STAGE_ONE_SCHEMA)
    stage_one = stage_one.observe(ACCOUNTING, *accounting_metrics())
    return _stateful(stage_one, ["cluster"], ClusterProcessor(policy, settings.topics(), settings.accounting_topic, start),
                     OUTPUT_SCHEMA)


def _fast_path(raw: Any, settings: Settings, policy: dict[str, Any], start: dict[str, Any] | None = None) -> Any:
    """Packed rows from raw Kafka rows: a mapInArrow router (the Python source packs in its own
    read tasks instead, see build_query), then the two stages of ``_fast_stages``."""
    from pyspark.sql import functions as F

    routed_df = raw.select(
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.col("key").cast("binary").alias("key"),
        F.col("value").cast("binary").alias("value"),
    ).mapInArrow(Router(policy, settings.events_topic, settings.node_buckets), ROUTED_SCHEMA)
    return _fast_stages(routed_df, settings, policy, start)


def _fast_stages(routed: Any, settings: Settings, policy: dict[str, Any], start: dict[str, Any] | None = None) -> Any:
    """Group by (cluster, bucket) -> BucketProcessor -> accounting -> group by cluster -> PackedClusterProcessor."""
    stage_one = _stateful(routed, ["cluster", "bucket"], BucketProcessor(policy, settings.node_buckets), PACKED_ONE_SCHEMA)
    stage_one = stage_one.observe(ACCOUNTING, *packed_metrics())
    return _stateful(stage_one, ["cluster"], PackedClusterProcessor(policy, settings.topics(), settings.accounting_topic, start),
                     OUTPUT_SCHEMA)


def start_plan(spark: Any, settings: Settings, checkpoint: str) -> StartPlan | None:
    """None when the checkpoint has committed state; else how the clusters start (a start on
    empty state: seeded from the directives topic, recovering; see core/recovery.py)."""
    if has_committed_batch(spark, checkpoint):
        return None
    from safepoint.connectors.seeds import read_seeds

    seeds = read_seeds(settings.librdkafka(), settings.directives_topic)
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
    """Start the streaming query and return it. ``pack_in_source=False`` makes the fast path pack
    in a separate mapInArrow even with the Python source, as it must with Spark's ``kafka`` format
    (tests use it to run that plan here, where the connector jar is absent)."""

    from safepoint.connectors.kafka_source import KafkaDataSource

    if settings.source_format == "python":
        spark.dataSource.register(KafkaDataSource)
    else:
        require_kafka_connector(spark)
    checkpoint = checkpoint or settings.checkpoint
    if not checkpoint:
        msg = "the job needs a checkpoint directory (--checkpoint)"
        raise ValueError(msg)
    policy = settings.policy().to_dict()
    check_checkpoint(spark, settings, checkpoint)
    plan = start_plan(spark, settings, checkpoint)
    start = plan.to_json() if plan is not None else None
    if settings.fast_path and settings.source_format == "python" and pack_in_source:
        outputs = _fast_stages(read_events(spark, settings, {"policy": policy, "buckets": settings.node_buckets}), settings, policy,
                               start)
    else:
        raw = read_events(spark, settings)
        outputs = (_fast_path if settings.fast_path else _plain_path)(raw, settings, policy, start)
    builtin = settings.source_format == "kafka"
    writer = outputs.writeStream.format("kafka" if builtin else "safepoint_kafka").queryName(QUERY_NAME)
    for k, v in kafka_options(settings, builtin).items():
        writer = writer.option(k, v)
    return (
        writer.option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(processingTime=f"{settings.trigger_ms} milliseconds")
        .start()
    )

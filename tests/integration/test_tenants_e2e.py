"""Tenants through the real broker and the Spark job: tenant a's long reader holds
``namespaces["a"]`` while ``namespace_safe_ts`` advances with the retention bound; the node's
listener and ``compact_up_to`` apply both; the Reporter refuses a reader below its namespace's
bound; and the job's outputs equal replay's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.listener import DirectiveListener, compact_up_to
from safepoint.connectors.reporter import Reporter
from safepoint.errors import ReaderRefused

from tests_support import JOB_START_TIMEOUT_S, QueryJob, caught_up, make_settings, topic_ends, verify, wait_for

pytestmark = pytest.mark.integration
RETENTION_US = 1_000_000  # one second of a microsecond MVCC clock


def mvcc_now() -> int:
    return time.time_ns() // 1_000


def test_a_tenants_long_reader_holds_only_its_namespace(broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "tenants", 1, retention=RETENTION_US, node_lease_ms=2_000, trigger_ms=200)
    ckpt = tmp_path / "ckpt"
    job = QueryJob(spark, settings, ckpt)
    rep = Reporter(broker.bootstrap, "n1", cluster="c1", mvcc_clock=mvcc_now, topic=settings.events_topic)
    listener = DirectiveListener(broker.bootstrap, "c1", topic=settings.directives_topic, reporter=rep).start()
    try:
        wait_for(lambda: listener.safe_ts is not None, JOB_START_TIMEOUT_S, "the first directive", job, every_s=0.5)
        with rep.reader(read_ts=mvcc_now(), namespace="a", label="tenant a's six-hour report") as report:
            held = report.read_ts

            def tenant_view() -> bool:
                d = listener.last_directive
                return bool(d and d.namespaces.get("a") == held and d.namespace_safe_ts is not None
                            and d.namespace_safe_ts > held + RETENTION_US)

            wait_for(tenant_view, 120, "namespace a held while the others advance", job, every_s=0.5)
            d = listener.last_directive
            assert d is not None
            assert d.safe_ts <= held, "the cluster's safe point keeps the reader too"
            assert compact_up_to(d, None, namespace="a") == held
            assert compact_up_to(d, None, namespace="b") == d.namespace_safe_ts > held
            assert compact_up_to(d, None) == d.safe_ts
            assert compact_up_to(d, held - 5, namespace="b") == held - 5, "never past the node's own oldest hold"
            with pytest.raises(ReaderRefused, match="namespace 'b'"):
                with rep.reader(read_ts=d.namespace_safe_ts - 1, namespace="b"):
                    pass
            with rep.reader(read_ts=held, namespace="a"):  # at its namespace's bound: protected
                pass
        wait_for(lambda: bool(listener.last_directive and listener.last_directive.namespaces == {}
                              and listener.last_directive.safe_ts > held), 60, "namespace a released", job, every_s=0.5)
    except BaseException:
        print(job.tail(80))
        raise
    finally:
        listener.close()
        rep.close()
    ends = topic_ends(broker.bootstrap, settings.events_topic)
    wait_for(lambda: caught_up(ckpt, ends), 120, "the job to finish the log", job)
    assert job.stop() == 0, job.tail()
    v = verify(broker.bootstrap, settings, ckpt)
    assert any(d.get("namespaces") == {"a": held} for d in v.directives["c1"])

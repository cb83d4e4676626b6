"""One job serves clusters of several engines: a ``[clusters.NAME]`` table gives a cluster its own
policy (retention, unit, thresholds, windows), and the job and replay apply each cluster's."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from test_batch import TOPICS, by_topic, messages

from safepoint.core import Engine
from safepoint.core.policy import Policies, Policy
from safepoint.errors import ConfigError
from safepoint.replay import final_status, replay_file
from safepoint.settings import load_settings

from local_job import LocalJob, replay_in_batches


def config(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "safepoint.toml"
    path.write_text(text)
    return load_settings(path, environ={})


def test_a_clusters_table_gives_a_cluster_its_own_policy_over_the_top_level(tmp_path: Path) -> None:
    s = config(tmp_path, 'retention = 100\nnode_lease_ms = 5000\n\n[clusters.etcd-main]\nmvcc_unit = "revision"\n'
                         'retention = 1000\n\n[clusters.pg]\nmvcc_unit = "xid"\n')
    policies = s.policies()
    assert policies.of("etcd-main").retention == 1000 and policies.of("etcd-main").mvcc_unit == "revision"
    assert policies.of("etcd-main").node_lease_ms == 5000, "the top level is the default of what a table leaves out"
    assert policies.of("pg").retention == 100 and policies.of("other").mvcc_unit == "none"
    assert Policies.from_dict(policies.to_dict()).of("pg").mvcc_unit == "xid"
    assert Policies.from_dict(Policy(retention=7).to_dict()).of("x").retention == 7, "a single policy: every cluster's"
    with pytest.raises(ConfigError, match=r"\[clusters.etcd\] .*sets events_topic"):
        config(tmp_path, '[clusters.etcd]\nevents_topic = "x"\n')
    with pytest.raises(ConfigError, match=r"\[clusters.etcd\]: policy key retention must be >= 0"):
        config(tmp_path, '[clusters.etcd]\nretention = -1\n')
    with pytest.raises(ConfigError, match="mvcc_unit must be one of"):
        config(tmp_path, '[clusters.etcd]\nmvcc_unit = "furlongs"\n')


def test_replay_applies_each_clusters_policy(tmp_path: Path) -> None:
    policies = Policies(Policy(retention=100), {"etcd": Policy(retention=10, mvcc_unit="revision")})
    lines = []
    for cluster in ("etcd", "other"):
        lines.append({"v": 1, "type": "topology", "cluster": cluster, "version": 1, "wall_ms": 1, "nodes": {"n1": []}})
        lines.append({"v": 1, "type": "heartbeat", "cluster": cluster, "node": "n1", "incarnation": 1, "seq": 1,
                      "wall_ms": 2, "mvcc_now": 1_000})
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = io.StringIO()
    engine = replay_file(str(path), out, policies, io.StringIO())
    safe = {d["cluster"]: d["safe_ts"] for d in map(json.loads, out.getvalue().splitlines()) if d["type"] == "compaction"}
    assert safe == {"etcd": 990, "other": 900}
    units = {c["cluster"]: c["mvcc_unit"] for c in final_status(engine)["clusters"]}
    assert units == {"etcd": "revision", "other": "none"}


def test_the_jobs_batches_apply_each_clusters_policy_as_replay_does() -> None:
    """Two clusters, one with its own retention, lease and bands: the job's operators (real Router and
    ClusterJob) over split batches give what replay gives."""
    default = Policy(retention=200_000, node_lease_ms=1_500, directive_interval_ms=100, stall_ms=3_000)
    own = Policy(retention=50_000, node_lease_ms=3_000, directive_interval_ms=0, stall_ms=0,
                 reader_age_warning_ms=1_000, reader_age_critical_ms=2_000, mvcc_unit="us")
    policies = Policies(default, {"c1": own})
    msgs = messages(5, partitions=2, clusters=2)
    size = len(msgs) // 5
    batches = [msgs[i:i + size] for i in range(0, len(msgs), size)]
    job = LocalJob(policies.to_dict(), TOPICS)
    written = []
    for batch in batches:
        written += job.run_batch(batch)
    got = by_topic(written)
    got.pop("st", None)
    expected = replay_in_batches(Engine(policies), batches)
    want = by_topic(expected)
    by_cluster = {c: [d for _k, d in want["dir"] if d["cluster"] == c and d["type"] == "compaction"] for c in ("c0", "c1")}
    assert by_cluster["c0"] and by_cluster["c1"], "both clusters advance"
    assert "reader_age" in {a["kind"] for _k, a in want["al"] if a["cluster"] == "c1"}, "c1's own bands"
    assert got["dir"] == want["dir"] and got["al"] == want["al"]


def test_the_guides_clusters_of_several_engines(tmp_path: Path) -> None:
    from doc_blocks import block

    s = config(tmp_path, block("docs/operations.md", "retention = 20000000").text)
    p = s.policies()
    assert (p.of("etcd-main").mvcc_unit, p.of("etcd-main").retention) == ("revision", 1000)
    assert (p.of("orders-pg").mvcc_unit, p.of("orders-pg").retention) == ("xid", 0)
    assert (p.of("anything-else").mvcc_unit, p.of("anything-else").retention) == ("us", 20_000_000)

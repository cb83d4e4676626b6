"""The deployment page's "Submitting to a Spark cluster" and the README's "Benchmark" commands, run from their blocks.

spark-submit: the command as written, with the addresses replaced (the master by ``local[2]``,
the brokers by an Apache Kafka of this test, the checkpoint by a local directory). Everything else
runs as written: ``--packages`` (Spark resolves the connector from Maven Central, or from the local
Maven repository where setup's Maven already put it), ``--source-format kafka``, ``docker/submit.py``,
the RocksDB provider, 16 shuffle partitions, 16 event partitions and 32 node buckets.

bench: the README's command with small sizes (the full run takes about 7 minutes; the flags are
the ones docs/benchmark.md lists), to exit 0 and write its report with the plain consumer's and the
job's rows."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from safepoint.devtools.apache_kafka import ApacheKafka
from safepoint.jars import KAFKA

from conftest import require_jars
from doc_blocks import ROOT, block
from kafka_util import produce, read_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kafka() -> Iterator[ApacheKafka]:
    require_jars(KAFKA)
    with ApacheKafka() as broker:  # its own broker: the command uses the default topic names
        yield broker


def submit_command(text: str, bootstrap: str, ckpt: Path) -> list[str]:
    words = shlex.split(text.replace("\\\n", " "))
    import pyspark

    words[0] = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    swap = {"--master": "local[2]", "--bootstrap": bootstrap, "--checkpoint": str(ckpt)}
    out: list[str] = []
    it = iter(words)
    for w in it:
        if w in swap:
            next(it)
            out += [w, swap[w]]
        else:
            out.append(w)
    return out


def heartbeat(node: str, seq: int, wall_ms: int) -> tuple[str, dict[str, object]]:
    return node, {"v": 1, "type": "heartbeat", "cluster": "c1", "node": node, "incarnation": 1, "seq": seq,
                  "wall_ms": wall_ms, "mvcc_now": wall_ms * 1000}


def test_the_readmes_spark_submit_command(kafka: ApacheKafka, tmp_path: Path) -> None:
    cmd = submit_command(block("docs/deploying.md", "spark-submit --master spark://master:7077").text, kafka.bootstrap,
                         tmp_path / "ckpt")
    assert "docker/submit.py" in cmd and cmd[cmd.index("--node-buckets") + 1] == "32"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEPOINT_")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    log = tmp_path / "submit.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "safepoint.events" not in kafka_topics(kafka.bootstrap):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(1)
        # two nodes named by a topology, so no discovery window to wait out: the job made the events
        # topic, stamped by the broker, so the events' own wall_ms do not move cluster time
        produce(kafka.bootstrap, "safepoint.events",
                [("c1", {"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": 32_000,
                         "nodes": {"n1": [], "n2": []}}),
                 heartbeat("n1", 1, 32_000), heartbeat("n2", 1, 32_000)])
        directives: list[dict[str, object]] = []
        while not any(x["type"] == "compaction" for x in directives):
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "no directive within 240 s:\n" + log.read_text(errors="replace")[-4000:]
            time.sleep(2)
            directives = read_topic(kafka.bootstrap, "safepoint.directives", timeout_s=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    [d] = [x for x in directives if x["type"] == "compaction"]
    assert d["cluster"] == "c1" and d["seq"] == 1 and d["safe_ts"] == 32_000_000, d
    assert [x["nodes"] for x in directives if x["type"] == "members"] == [["n1", "n2"]] and d["members"] == 2
    assert json.loads((tmp_path / "ckpt" / "safepoint.json").read_text())["node_buckets"] == 32


def kafka_topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def test_the_readmes_bench_command(tmp_path: Path) -> None:
    command = block("README.md", ".venv/bin/safepoint bench").text.split("#", 1)[0].strip()
    assert command == ".venv/bin/safepoint bench"
    # one Spark run (the status-off run is the same job with one setting changed; a fresh JVM each costs half a minute)
    small = ["--events", "20000", "--nodes", "50", "--phases", "raw,plain,spark", "--masters", "local[2]", "--status-off", "",
             "--out", str(tmp_path)]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run([*shlex.split(command), *small], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [report] = tmp_path.glob("bench-*.json")
    figures = json.loads(report.read_text())
    text = next(tmp_path.glob("bench-*.md")).read_text()
    assert "(2) plain consumer" in text and "(3a) job local[2]" in text, text
    assert figures, report

"""The test brokers' class-data archive (``devtools/apache_kafka.classes_archive``): a broker that
stops cleanly leaves one beside the jars when none was there, the JVM maps it (``-Xshare:on``
refuses an archive it cannot use), and every broker started after it is given it."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from safepoint.devtools.apache_kafka import ApacheKafka, KafkaNode, classes_archive
from safepoint.jars import KAFKA, require
from safepoint.streaming.java import java_binary

pytestmark = pytest.mark.integration


def test_a_clean_stop_leaves_an_archive_the_next_brokers_map(tmp_path: Path) -> None:
    java = java_binary()
    assert java is not None
    jars = require(KAFKA)
    archive = classes_archive(java, jars)
    kafka = ApacheKafka(nodes=1, data_dir=tempfile.mkdtemp(dir=tmp_path))
    with kafka:
        pass  # started (formatted first) and stopped cleanly: the archive is there, made now or before
    assert archive.is_file(), f"no class-data archive at {archive} after a clean stop"
    assert not list((tmp_path).rglob("classes-*.jsa")), "a start's own archive is moved or removed"
    mapped = subprocess.run([java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", ":".join(map(str, jars)),
                             "-version"], capture_output=True, text=True, check=False, timeout=60)
    assert mapped.returncode == 0, mapped.stderr[-2000:]
    node = KafkaNode(node_id=1, port=1, controller_port=2, folder=tmp_path / "n1")
    assert f"-XX:SharedArchiveFile={archive}" in kafka._java(node, dump=tmp_path / "x.jsa")

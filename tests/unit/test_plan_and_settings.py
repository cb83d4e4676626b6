"""Offset planning of the Kafka source, settings precedence, and the replay command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from safepoint.cli import main
from safepoint.errors import ConfigError
from safepoint.settings import Secret, Settings, load_settings
from safepoint.streaming.kafka_source import (
    KafkaInputPartition,
    KafkaReadTask,
    KafkaStreamReader,
    group_ranges,
    plan_offsets,
)


class _Marks(KafkaStreamReader):
    """The reader with the broker's watermarks given (``marks``: partition -> (low, high))."""

    def __init__(self, options: dict[str, str], marks: dict[str, tuple[int, int]]) -> None:
        super().__init__({"bootstrap.servers": "127.0.0.1:1", "subscribe": "t", **options})
        self.marks = marks

    def _watermarks(self) -> dict[str, tuple[int, int]]:
        return self.marks

    def _topic_id(self, topic: str, known: str | None) -> str | None:
        return None  # a broker without topic ids

    records: dict[tuple[str, int], list[int]] = {}
    """(partition key, offset) -> the record's fingerprint there (none: no fingerprints are taken)."""

    def _print(self, key: str, offset: int) -> list[int] | None:
        return self.records.get((key, offset))


def test_a_topic_made_again_past_the_offsets_is_told_by_its_fingerprint() -> None:
    """A broker without topic ids: the record the job read at offset 9 of partition 0 is another one after the
    topic was made again and filled past where the job stood; a run's first plan reads it again, finds the
    gap (gone_back) and reads every partition of the topic from its start."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = _Marks({}, {"0": (0, 10), "1": (0, 4)})
    reader.records = {("0", 9): [9, 1, 1_000, 77], ("1", 3): [3, 1, 1_001, 78]}
    first = reader.latestOffset({"0": 6, "1": 2}, ReadAllAvailable())
    assert first["prints"] == {"0": [9, 1, 1_000, 77], "1": [3, 1, 1_001, 78]} and "gaps" not in first
    assert reader.latestOffset(first, ReadAllAvailable()) == first, "no new records: the same offset (no empty batch)"
    # the job stops; the topic is made again and filled past offsets 10 and 4 by other records
    restarted = _Marks({}, {"0": (0, 12), "1": (0, 6)})
    restarted.records = {("0", 9): [9, 1, 5_000, 12], ("1", 3): [3, 1, 5_001, 13]}
    end = restarted.latestOffset(first, ReadAllAvailable())
    assert [(g["partition"], g["kind"]) for g in end["gaps"]] == [(0, "gone_back"), (1, "gone_back")]
    assert restarted.partitions(first, end)[0].value == ("t", 0, 0, 12), "read again from its start"
    # the same topic, the same records: nothing found
    same = _Marks({}, {"0": (0, 12), "1": (0, 6)})
    same.records = dict(reader.records)
    assert "gaps" not in same.latestOffset(first, ReadAllAvailable())


def test_the_first_batch_of_a_run_takes_its_own_cap_then_the_usual_one() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows

    reader = _Marks({"maxOffsetsPerTrigger": "100", "maxOffsetsFirstTrigger": "10"}, {"0": (0, 0), "1": (0, 0)})
    start = {"0": 0, "1": 0}
    assert reader.latestOffset(start, ReadMaxRows(100)) == start  # nothing to read: the first batch is still to come
    reader.marks = {"0": (0, 500), "1": (0, 500)}
    first = reader.latestOffset(start, ReadMaxRows(100))
    assert first == {"0": 5, "1": 5}
    assert reader.latestOffset(first, ReadMaxRows(100)) == {"0": 55, "1": 55}
    # a cap of its own above the usual one changes nothing; 0 is no cap of its own
    for first_cap in ("1000", "0"):
        assert _Marks({"maxOffsetsFirstTrigger": first_cap}, reader.marks).latestOffset(start, ReadMaxRows(100)) == {
            "0": 50, "1": 50}
    with pytest.raises(ValueError, match="maxOffsetsFirstTrigger must be >= 0"):
        _Marks({"maxOffsetsFirstTrigger": "-1"}, {})


def test_plan_offsets_without_limit_reads_everything() -> None:
    assert plan_offsets({"0": 5, "1": 0}, {"0": 9, "1": 3}, None) == {"0": 9, "1": 3}


def test_plan_offsets_shares_the_limit_fairly() -> None:
    assert plan_offsets({"0": 0, "1": 0, "2": 0}, {"0": 100, "1": 2, "2": 100}, 10) == {"0": 4, "1": 2, "2": 4}


@given(
    st.dictionaries(st.sampled_from(["0", "1", "2", "3"]), st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1),
    st.one_of(st.none(), st.integers(1, 120)),
)
@settings(max_examples=200, deadline=None)
def test_plan_offsets_never_overreads_and_uses_the_budget(parts: dict[str, tuple[int, int]], limit: int | None) -> None:
    start = {p: s for p, (s, _) in parts.items()}
    latest = {p: s + n for p, (s, n) in parts.items()}
    end = plan_offsets(start, latest, limit)
    assert all(start[p] <= end[p] <= latest[p] for p in parts)
    taken = sum(end[p] - start[p] for p in parts)
    available = sum(latest[p] - start[p] for p in parts)
    assert taken == (available if limit is None else min(limit, available))


@given(st.lists(st.integers(1, 60_000), min_size=1, max_size=8), st.integers(0, 50_000))
@settings(max_examples=200, deadline=None)
def test_read_tasks_take_every_range_once_and_split_only_large_batches(sizes: list[int], min_rows: int) -> None:
    ranges = [KafkaInputPartition("t", p, 100 * p, 100 * p + n) for p, n in enumerate(sizes)]
    tasks = group_ranges(ranges, min_rows)
    read = [r for t in tasks for r in (t.ranges if isinstance(t, KafkaReadTask) else [t])]
    assert sorted(r.value for r in read) == sorted(r.value for r in ranges)
    total = sum(sizes)
    expected = len(sizes) if min_rows == 0 else max(1, min(len(sizes), total // min_rows))
    assert len(tasks) == expected
    loads = sorted(sum(r.end - r.start for r in (t.ranges if isinstance(t, KafkaReadTask) else [t])) for t in tasks)
    if len(tasks) > 1:  # no task could give its smallest range to the lightest and end lighter than it was
        assert loads[0] + max(sizes) >= loads[-1]


def test_a_small_batch_is_one_read_task_in_partition_order() -> None:
    ranges = [KafkaInputPartition("t", p, 0, n) for p, n in enumerate([300, 500, 200, 400])]
    (task,) = group_ranges(ranges, 10_000)
    assert isinstance(task, KafkaReadTask)
    assert [r.partition for r in task.ranges] == [0, 1, 2, 3]
    assert group_ranges(ranges, 0) == ranges
    assert [len(t.ranges) if isinstance(t, KafkaReadTask) else 1 for t in group_ranges(ranges, 600)] == [2, 2]


def test_settings_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('retention = 5\nnode_lease_ms = 7\ntrigger_ms = 9\n[kafka]\n"sasl.password" = "hunter2"\n')
    s = load_settings(cfg, {"retention": 1}, environ={"SAFEPOINT_NODE_LEASE_MS": "8"})
    assert (s.retention, s.node_lease_ms, s.trigger_ms) == (1, 8, 9)
    assert isinstance(s.kafka["sasl.password"], Secret) and "hunter2" not in repr(s)
    assert s.librdkafka()["sasl.password"] == "hunter2"


def test_node_buckets_from_file_env_and_flags(tmp_path: Path) -> None:
    assert Settings().node_buckets == 8
    cfg = tmp_path / "c.toml"
    cfg.write_text("node_buckets = 3\n")
    assert load_settings(cfg, environ={}).node_buckets == 3
    assert load_settings(cfg, environ={"SAFEPOINT_NODE_BUCKETS": "4"}).node_buckets == 4
    assert load_settings(cfg, {"node_buckets": "5"}, environ={"SAFEPOINT_NODE_BUCKETS": "4"}).node_buckets == 5


def test_the_retired_fast_path_setting_is_refused_with_what_to_do(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("fast_path = false\n")
    with pytest.raises(ConfigError, match="setting 'fast_path' in .* was removed: the job has one path"):
        load_settings(cfg, environ={})


@pytest.mark.parametrize(("text", "needle"), [("bogus = 1", "unknown setting 'bogus'"), ("retention = -1", ">= 0"),
                                               ("retention = 'x'", "must be an integer"),
                                               ("node_buckets = 0", "node_buckets must be at least 1"),
                                               ("read_task_min_rows = -1", "read_task_min_rows must be 0 or more"),
                                               ('driver_memory = "2 GB"', "driver_memory must be a JVM memory size"),
                                               ("first_batch_max_offsets = -1", "first_batch_max_offsets must be 0 or more"),
                                               ("jvm_jit = 'c2'", "jvm_jit must be 'c1' or 'tiered'"),
                                               ("jvm_gc = 'zgc'", "jvm_gc must be 'serial' or 'default'")])
def test_bad_settings_say_what_to_fix(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_settings(cfg, environ={})


def test_simulate_counts_its_clusters_beside_a_files_cluster_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``safepoint simulate --clusters N`` is a count, not the settings' ``[clusters.NAME]`` tables: it was
    refused with or without a file ("setting clusters (flag --clusters) must be tables"), which
    docker/compose.yaml's simulator found the first time it ran (with the job's file mounted, which has
    a cluster table of its own)."""
    import safepoint.devtools.simulate as simulate

    seen: dict[str, object] = {}

    def fake_run(bootstrap: str, topic: str, cfg: object, duration: object, seed: object, conf: object, *,
                 clusters: int, flush_timeout_s: float) -> int:
        seen.update(bootstrap=bootstrap, topic=topic, clusters=clusters, nodes=getattr(cfg, "nodes", None))
        return 0

    monkeypatch.setattr(simulate, "run_simulator", fake_run)
    config = tmp_path / "safepoint.toml"
    config.write_text('events_topic = "ev"\n[clusters.pg]\nmvcc_unit = "xid"\n')
    assert main(["simulate", "--config", str(config), "--clusters", "2", "--nodes", "4", "--bootstrap", "k:1"]) == 0
    assert seen == {"bootstrap": "k:1", "topic": "ev", "clusters": 2, "nodes": 4}
    assert main(["simulate", "--clusters", "3", "--bootstrap", "k:1"]) == 0 and seen["clusters"] == 3


def test_replay_command_writes_directives_and_dead_letters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "e.jsonl"
    lines = [
        {"v": 1, "type": "heartbeat", "node": "a", "incarnation": 0, "seq": 0, "wall_ms": 0, "mvcc_now": 50},
        {"v": 1, "type": "heartbeat", "node": "a", "incarnation": 0, "seq": 1, "wall_ms": 2000, "mvcc_now": 60},
    ]
    events.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    out, dl = tmp_path / "o.jsonl", tmp_path / "d.jsonl"
    rc = main(["replay", "--input", str(events), "--output", str(out), "--deadletter-output", str(dl),
               "--node-lease-ms", "1000", "--retention", "10"])
    assert rc == 0
    directives = [json.loads(x) for x in out.read_text().splitlines()]
    assert [d["type"] for d in directives] == ["members", "compaction"]
    assert [(d["seq"], d["safe_ts"]) for d in directives[1:]] == [(1, 50)]
    assert json.loads(dl.read_text())["error"].startswith("not JSON")
    assert "final safe_ts {'default': 50}" in capsys.readouterr().err


def test_replay_command_missing_input_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--input", "/nonexistent/e.jsonl"]) == 2
    assert "input file not found" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [{}, {"safepoint.policy": "{"}])
def test_packing_source_needs_its_options(extra: dict[str, str]) -> None:
    from safepoint.streaming.source import PackingStreamReader

    opts = {"bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "safepoint.pack": "true", **extra}
    with pytest.raises(ValueError, match="safepoint.pack=true needs option safepoint.policy"):
        PackingStreamReader(opts)
    assert PackingStreamReader({**opts, "safepoint.policy": "{\"retention\": 4}"}).policy == {"retention": 4}


@pytest.mark.parametrize(("text", "needle"), [
    ('expire_enabled = "maybe"', r"expire_enabled \(in .*c.toml\) must be true or false"),
    ("expire_enabled = 1", r"expire_enabled \(in .*c.toml\) must be true or false"),
    ("retention = 1.9", r"retention \(in .*c.toml\) must be an integer, got 1.9"),
    ("node_lease_ms = true", r"node_lease_ms \(in .*c.toml\) must be an integer, got True"),
    ("bootstrap = 9092", r"bootstrap \(in .*c.toml\) must be a string"),
    ('kafka = "x"', r"kafka \(in .*c.toml\) must be a table"),
])
def test_toml_values_are_type_checked_as_strictly_as_flags(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_settings(cfg, environ={})


@pytest.mark.parametrize(("name", "raw", "needle"), [
    ("EXPIRE_ENABLED", "ture", r"expire_enabled \(environment variable SAFEPOINT_EXPIRE_ENABLED\) must be true or false"),
    ("RETENTION", "1.9", r"retention \(environment variable SAFEPOINT_RETENTION\) must be an integer, got '1.9'"),
    ("NODE_LEASE_MS", "30s", r"must be an integer, got '30s'"),
])
def test_environment_values_are_type_checked(name: str, raw: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_settings(environ={f"SAFEPOINT_{name}": raw})


def test_good_words_still_read() -> None:
    s = load_settings(environ={"SAFEPOINT_EXPIRE_ENABLED": "No", "SAFEPOINT_RETENTION": " 25 ", "SAFEPOINT_CLIENT": "kafka-python"})
    assert (s.expire_enabled, s.retention, s.client) == (False, 25, "kafka-python")


def test_a_bad_setting_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('expire_enabled = "maybe"\n')
    assert main(["replay", "--input", str(cfg), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expire_enabled" in err[0] and "must be true or false" in err[0]


def test_checkpoint_offsets_are_read_in_either_source_format_and_checked() -> None:
    from safepoint.streaming.checkpoint import check_offsets, offsets_of

    assert offsets_of('{"1": 40, "0": 12}', "t") == {0: 12, 1: 40}
    assert offsets_of('{"t": {"0": 7}}', "t") == {0: 7}
    assert offsets_of("-", "t") is None
    check_offsets(3, {0: 12, 1: 40}, {0: 12, 1: 41}, "t", "/ck")
    with pytest.raises(ConfigError, match="partition 1 up to offset 40 \\(batch 3\\), but that partition ends at offset 2"):
        check_offsets(3, {0: 12, 1: 40}, {0: 12, 1: 2}, "t", "/ck")
    with pytest.raises(ConfigError, match="partition 1 up to offset 40 .* does not exist"):
        check_offsets(3, {0: 12, 1: 40}, {0: 12}, "t", "/ck")


def test_the_spark_ui_is_a_setting_and_off_by_default() -> None:
    from safepoint.streaming.session import spark_conf

    assert load_settings(environ={}).spark_ui is False
    assert load_settings(environ={"SAFEPOINT_SPARK_UI": "true"}).spark_ui is True
    assert spark_conf(2)["spark.ui.enabled"] == "false"
    assert spark_conf(2, ui=True)["spark.ui.enabled"] == "true"
    assert spark_conf(2)["spark.driver.memory"] == Settings().driver_memory == "1g"
    assert spark_conf(2, driver_memory="1536m")["spark.driver.memory"] == "1536m"
    assert spark_conf(2)["spark.sql.streaming.stateStore.rocksdb.blockSizeKB"] == "64"  # small values compress in blocks


def test_the_class_data_archive_is_used_only_where_there_is_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """streaming/classes.py: the JVM options name the archive when the file exists, nothing
    otherwise; SAFEPOINT_SPARK_CLASSES names another path, or turns it off."""
    from safepoint.streaming.classes import ENV, archive_path, java_options

    archive = tmp_path / "classes.jsa"
    monkeypatch.setenv(ENV, str(archive))
    assert archive_path() == archive
    assert java_options() == ""
    archive.write_bytes(b"x")
    assert java_options().split() == [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", "-Xlog:cds=off",
                                      "-Xlog:cds+dynamic=off"]
    monkeypatch.setenv(ENV, "off")
    assert archive_path() is None and java_options() == ""
    monkeypatch.delenv(ENV)
    default = archive_path()
    assert default is not None and default.name.startswith("spark-classes-") and default.suffix == ".jsa"


def test_the_worker_daemon_drops_only_zips_of_the_installed_pyspark(tmp_path: Path) -> None:
    """streaming/worker_daemon.py: Spark's zips of a PySpark installed on the path itself leave the
    path (the installed package is imported, compiled once); any other Spark's zip stays."""
    from safepoint.streaming.session import spark_conf
    from safepoint.streaming.worker_daemon import installed_copies

    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    for package in ("pyspark", "py4j"):
        (site / package).mkdir(exist_ok=True)
        (site / package / "__init__.py").write_text("")
    ours = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    cluster = ["/opt/spark/python/lib/pyspark.zip", "/opt/spark/python/lib/py4j-0.10.9.9-src.zip"]
    assert installed_copies([*ours, *cluster, str(site)]) == ours
    assert installed_copies([*ours, *cluster]) == [], "the installed package is not on the path: the zips stay"
    linked = tmp_path / "spark-home"
    linked.symlink_to(site / "pyspark")  # a SPARK_HOME that links to the installed PySpark (the image's /opt/spark)
    via_link = [str(linked / "python" / "lib" / "pyspark.zip"), str(linked / "python" / "lib" / "py4j-0.10.9.9-src.zip")]
    assert installed_copies([*via_link, str(site)]) == via_link
    (site / "py4j" / "__init__.py").unlink()
    assert installed_copies([*ours, str(site)]) == ours[:1]
    assert spark_conf(2)["spark.python.daemon.module"] == "safepoint.streaming.worker_daemon"


@pytest.mark.parametrize("spark_home", ["linked", "another"])
def test_sparks_own_daemon_starts_with_the_zips_of_any_spark_home(tmp_path: Path, spark_home: str) -> None:
    """``python -m pyspark.daemon`` as Spark starts it (its data source lookup), with the zips of a
    SPARK_HOME on the path: one that links to the installed PySpark (dropped), and another Spark's (kept,
    the daemon redirected once). Both died before (``module 'pyspark.daemon' has no attribute 'worker'``:
    the path file ran twice and redirected the daemon's own import), and every Python data source lookup
    with them: the image's job found it. The daemon prints its port (four bytes) and ends when its stdin does."""
    import os
    import shutil
    import subprocess
    import sys

    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    if not (lib / "pyspark.zip").exists():
        pytest.skip("this PySpark has no pyspark.zip")
    home = tmp_path / "spark"
    if spark_home == "linked":
        home.symlink_to(Path(pyspark.__file__).parent)
    else:
        shutil.copytree(lib, home / "python" / "lib")
    zips = [str(home / "python" / "lib" / z.name) for z in sorted(lib.glob("*.zip"))]
    done = subprocess.run([sys.executable, "-m", "pyspark.daemon"], capture_output=True, timeout=60, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.pathsep.join(zips)}, check=False)
    assert b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    assert len(done.stdout) >= 4, (done.stdout, done.stderr.decode(errors="replace"))


def test_the_worker_daemon_preloads_what_workers_import_without_starting_a_thread() -> None:
    """A daemon forks its workers: what it imports first must start no thread (a fork copies only
    the forking one, half-way through whatever the others held). pyarrow and pandas come too where
    the environment keeps them to one thread, and stay out where it does not."""
    import os
    import subprocess
    import sys

    from safepoint.streaming.worker_daemon import PRELOAD, PRELOAD_ARROW, THREAD_FREE_ENV

    probe = ("import os, sys; from safepoint.streaming.worker_daemon import preload; preload(); "
             "print(len(os.listdir('/proc/self/task')), *(m in sys.modules for m in sys.argv[1:]))")
    bare = {k: v for k, v in os.environ.items() if k not in (*THREAD_FREE_ENV, "OMP_NUM_THREADS")}

    def run(**env: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", probe, *PRELOAD, *PRELOAD_ARROW], capture_output=True, text=True,
                              check=True, env={**bare, **env}).stdout.split()

    assert run() == ["1", *["True"] * (len(PRELOAD) + len(PRELOAD_ARROW))]
    assert run(OPENBLAS_NUM_THREADS="4") == ["1", *["True"] * len(PRELOAD), *["False"] * len(PRELOAD_ARROW)]
    assert run(OMP_NUM_THREADS="2") == ["1", *["True"] * len(PRELOAD), *["False"] * len(PRELOAD_ARROW)]
    assert run(JE_ARROW_MALLOC_CONF="narenas:1") == ["1", *["True"] * len(PRELOAD), *["False"] * len(PRELOAD_ARROW)]
    # an executor without pandas: the daemon still starts, with what it could import
    blocked = ("import sys; sys.modules['pandas'] = None; " + probe).replace("print(", "sys.modules.pop('pandas'); print(")
    out = subprocess.run([sys.executable, "-c", blocked, "pyarrow", "pandas"], capture_output=True, text=True, check=True,
                         env=bare).stdout.split()
    assert out == ["1", "True", "False"], out


@pytest.mark.parametrize("which", ["driver-worker", "source-runner"])
def test_the_spark_driver_side_python_processes_end_quietly_when_the_jvm_goes_first(tmp_path: Path, which: str) -> None:
    """PySpark's ``transform_with_state_driver_worker`` and its ``python_streaming_source_runner``
    themselves, started as Spark starts them (its zip on the path, the connection back to the "JVM"
    named in its environment), against a stand-in JVM that closes as a stopping query does (the
    worker: after the command; the runner: after the Python version): one line, no traceback (each
    printed an ``EOFError`` and a ``BrokenPipeError`` in a full-suite run of
    tests/integration/test_stop.py). With the hook left out (a Python without the project's path
    file's call) the tracebacks are there: the test sees the failure it guards against."""
    import os
    import pickle
    import socket
    import struct
    import subprocess
    import sys
    import threading

    import pyspark

    from safepoint.streaming.worker_daemon import DRIVER_WORKER, QUIET_WHEN_JVM_GONE, SOURCE_RUNNER

    module = DRIVER_WORKER if which == "driver-worker" else SOURCE_RUNNER
    zip_path = Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"
    if not zip_path.exists():
        pytest.skip("this PySpark has no pyspark.zip")

    def run(hooked: bool) -> subprocess.CompletedProcess[str]:
        path = str(tmp_path / f"jvm-{hooked}.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)

        def jvm() -> None:
            conn, _ = server.accept()
            f = conn.makefile("rwb")
            struct.unpack("!i", f.read(4))  # the worker's pid
            version = b"%d.%d" % sys.version_info[:2]
            command = pickle.dumps((len, None))
            if module == SOURCE_RUNNER:  # the runner reads its files next: the query stops instead
                f.write(struct.pack("!i", len(version)) + version)
                f.flush()
            else:
                f.write(struct.pack("!i", len(version)) + version + struct.pack("!i", len(command)) + command)
                f.flush()
                struct.unpack("!i", f.read(4))  # "send me the state server's port": the query stops instead
            f.close()
            conn.close()

        thread = threading.Thread(target=jvm, daemon=True)
        thread.start()
        env = {**os.environ, "PYTHON_WORKER_FACTORY_SOCK_PATH": path, "PYTHONPATH": str(zip_path)}
        env.pop("PYTHON_WORKER_FACTORY_SECRET", None)
        argv = [sys.executable, *([] if hooked else ["-S"]), "-m", module]
        if not hooked:  # no site: no path file; the installed PySpark from the zip alone
            env["PYTHONPATH"] = os.pathsep.join([str(zip_path), *[p for p in sys.path if p.endswith("site-packages")]])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
        thread.join(10)
        server.close()
        return done

    quiet = run(hooked=True)
    assert "Traceback" not in quiet.stderr, quiet.stderr
    assert f"{QUIET_WHEN_JVM_GONE[module]} ended: the JVM closed its connection" in quiet.stderr, quiet.stderr
    loud = run(hooked=False)
    assert "Traceback" in loud.stderr and "BrokenPipeError" in loud.stderr, loud.stderr


def test_a_dropped_zip_leaves_no_finder_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``importlib.invalidate_caches()`` (PySpark calls it in a worker's first task) rereads every
    zip that still has a finder cached: a dropped zip's finder goes with it."""
    import sys
    import zipfile
    import zipimport

    from safepoint.streaming.worker_daemon import drop_installed_copies

    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as z:
        z.writestr("pyspark/__init__.py", "")
    zipped = str(lib / "pyspark.zip")
    monkeypatch.setattr(sys, "path", [zipped, str(site), *sys.path])
    monkeypatch.setitem(sys.path_importer_cache, zipped, zipimport.zipimporter(zipped))
    drop_installed_copies()
    assert zipped not in sys.path
    assert zipped not in sys.path_importer_cache


def test_setup_makes_every_python_of_the_environment_import_the_installed_pyspark(tmp_path: Path) -> None:
    """scripts/safepoint-spark-path.pth (put in site-packages by scripts/setup.sh): a Python started
    with Spark's zips first on its path, as Spark starts its planning processes, imports PySpark
    and Py4J from the installed packages."""
    import subprocess
    import sys
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    pth = site / "safepoint-spark-path.pth"
    assert pth.read_text() == (Path(__file__).parents[2] / "scripts" / "safepoint-spark-path.pth").read_text()
    lib = site / "pyspark" / "python" / "lib"
    zips = [str(lib / "pyspark.zip"), *map(str, lib.glob("py4j-*.zip"))]
    out = subprocess.run([sys.executable, "-c", "import pyspark, py4j; print(pyspark.__file__); print(py4j.__file__)"],
                         env={"PYTHONPATH": ":".join(zips), "PATH": "/usr/bin:/bin"}, cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == [str(site / "pyspark" / "__init__.py"), str(site / "py4j" / "__init__.py")]


def _hang_up_on(server: object, token: str, updates: bool) -> None:
    """Connect to an accumulator server as the JVM does (its token, then rounds of updates) and hang up."""
    import socket
    import struct

    with socket.create_connection(server.server_address, timeout=5) as conn:  # type: ignore[attr-defined]
        conn.sendall(token.encode() + (struct.pack("!i", 0) if updates else b""))
        if updates:
            assert conn.recv(1) == struct.pack("!b", 1)  # the server took one (empty) round of updates


def _stderr_until(capfd: pytest.CaptureFixture[str], needle: str) -> str:
    import time

    err, deadline = "", time.monotonic() + 20
    while needle not in err and time.monotonic() < deadline:
        time.sleep(0.05)
        err += capfd.readouterr().err
    return err


def test_the_jvm_hanging_up_on_the_accumulator_server_prints_nothing_and_other_errors_still_show(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from pyspark.accumulators import _start_update_server

    from safepoint.streaming.session import quiet_accumulator_hangup

    bare = _start_update_server("token-a", False)
    quieted = _start_update_server("token-b", False)
    quiet_accumulator_hangup(quieted)
    try:
        _hang_up_on(bare, "token-a", updates=True)
        assert "EOFError" in _stderr_until(capfd, "EOFError")  # what a stop printed before
        _hang_up_on(quieted, "token-b", updates=True)
        # the server handles one connection at a time: the next is read only after the hang-up was
        _hang_up_on(quieted, "token-x", updates=False)
        err = _stderr_until(capfd, "is not correct")
        assert "The value of the provided token to the AccumulatorServer is not correct" in err  # still reported
        assert "EOFError" not in err
    finally:
        bare.shutdown()
        quieted.shutdown()


def test_the_jvm_choices_are_build_sessions_keywords() -> None:
    """Every command that starts a JVM passes ``Settings.jvm()`` to ``build_session``: its keys are
    that function's parameters, with the settings' values."""
    import inspect

    from safepoint.streaming.session import build_session

    choices = Settings(jvm_jit="tiered", driver_memory="2g", jvm_gc="default").jvm()
    assert choices == {"jit": "tiered", "driver_memory": "2g", "gc": "default"}
    assert set(choices) <= set(inspect.signature(build_session).parameters)


def test_a_worker_the_jvm_drops_before_its_first_byte_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopping JVM may close a just-forked worker's connection: PySpark's own worker dies
    reading the secret (the traceback a clean stop printed); the daemon's wrapper ends it with 1
    (no reuse) instead. A worker that is sent its secret still runs PySpark's handshake: a wrong
    one is refused with "err", the peeked bytes all still there to read."""
    import signal
    import socket
    import struct

    import pyspark.daemon

    from safepoint.streaming.worker_daemon import quiet_when_dropped

    monkeypatch.setenv("PYTHON_WORKER_FACTORY_SECRET", "right")
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGCHLD, signal.SIGINT)}
    wrapped = quiet_when_dropped(pyspark.daemon.worker)
    try:
        closed, peer = socket.socketpair()
        peer.close()
        with pytest.raises(EOFError):
            pyspark.daemon.worker(closed, False)
        assert wrapped(closed, False) == 1
        reset, peer = socket.create_server(("127.0.0.1", 0)), None
        client = socket.create_connection(reset.getsockname())
        peer, _ = reset.accept()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # an RST, as the JVM's abort sends
        assert wrapped(peer, False) == 1
        asked, jvm = socket.socketpair()
        jvm.sendall(struct.pack(">i", 5) + b"wrong")
        assert wrapped(asked, False) == 1
        assert jvm.recv(16) == struct.pack(">i", 3) + b"err"
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _dropped_worker_stderr(spark_zips: bool) -> str:
    """Start ``python -m pyspark.daemon`` as Spark starts its own daemon (with Spark's zips first on
    ``PYTHONPATH``, or without them), ask it for a worker and drop the connection before the
    secret, as a stopping JVM does; then end the daemon (its stdin closed) and return its stderr."""
    import os
    import socket
    import struct
    import subprocess
    import sys
    import time

    import pyspark

    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    zips = [os.path.join(lib, name) for name in sorted(os.listdir(lib)) if name.endswith(".zip")]
    env = {**os.environ, "PYTHON_WORKER_FACTORY_SECRET": "s", "SPARK_REUSE_WORKER": "1",
           "PYTHONPATH": os.pathsep.join(zips if spark_zips else [])}
    daemon = subprocess.Popen([sys.executable, "-m", "pyspark.daemon"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
    try:
        assert daemon.stdout is not None and daemon.stdin is not None
        (port,) = struct.unpack(">i", daemon.stdout.read(4))
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.recv(4)  # the forked worker's pid: the daemon's acknowledgement
        time.sleep(0.5)  # the worker reads its secret from the closed connection
        daemon.stdin.close()  # the daemon ends when its stdin does
        daemon.wait(timeout=30)
        assert daemon.stderr is not None
        return daemon.stderr.read().decode(errors="replace")
    finally:
        daemon.kill()


def test_sparks_own_daemon_also_ends_a_dropped_worker_quietly() -> None:
    """Spark starts its data source planning workers through ``python -m pyspark.daemon``, not the
    job's daemon module; the environment's start hook (``scripts/safepoint-spark-path.pth``, on
    seeing Spark's zips) runs the quiet daemon under that name. Without the hook (no zips on the
    path) the same dropped connection prints PySpark's traceback: the failure the hook prevents."""
    assert "Traceback" not in _dropped_worker_stderr(spark_zips=True)
    unhooked = _dropped_worker_stderr(spark_zips=False)
    assert "Traceback" in unhooked and "EOFError" in unhooked, unhooked[-2000:]


def test_a_batch_planned_before_records_went_takes_them_as_a_gap_when_it_is_made() -> None:
    """``partitions`` (a batch made, or made again after a failure) finds records deleted, or a topic made
    again, since the batch was planned: it reads what is there and hands the gap to the read tasks."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    reader = _Marks({}, {"0": (5, 10), "1": (0, 2)})
    tasks = reader.partitions({"0": 2, "1": 6}, {"0": 10, "1": 9})
    ranges = sorted((t.partition, t.start, t.end) for t in tasks)  # type: ignore[attr-defined]
    assert ranges == [(0, 5, 10), (1, 0, 2)]
    kinds = [(g["partition"], g["kind"]) for g in tasks[0].gaps]  # type: ignore[attr-defined]
    assert kinds == [(0, "lost"), (1, "gone_back")]
    end = reader.latestOffset({"0": 10, "1": 9}, ReadMaxRows(100))
    assert [g["kind"] for g in end["gaps"]][:2] == ["lost", "gone_back"], "the next offset records them"


def test_the_control_topic_is_read_with_the_events_topic_keyed_apart_and_its_gaps_say_so() -> None:
    """``controlTopic``: its partition p is keyed ``control_partition(p)`` (-2 - p) beside the events
    topic's; a checkpoint of a job that read only the events topic goes on, the control topic from
    its start; a gap there is the control topic's (``control``) and numbered in the one sequence."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from safepoint.core.gaps import Gap
    from safepoint.core.origin import control_partition

    reader = _Marks({"controlTopic": "ctl"}, {"0": (0, 8), "1": (0, 3), "-2": (0, 4)})
    first = reader.latestOffset({"0": 8, "1": 3}, ReadMaxRows(100))  # an older checkpoint: no control key
    assert first == {"0": 8, "1": 3, "-2": 4} and "gaps" not in first, "no partition-count gap: the control topic is new"
    tasks = reader.partitions({"0": 8, "1": 3}, first)
    assert [(t.topic, t.partition, t.start, t.end) for t in tasks] == [("ctl", 0, 0, 4)]  # type: ignore[attr-defined]
    reader.marks = {"0": (2, 9), "1": (0, 3), "-2": (6, 7)}  # the control topic lost offsets 4..5
    later = reader.latestOffset(first, ReadMaxRows(100))
    (gap,) = later["gaps"]
    assert gap["control"] is True and (gap["topic"], gap["partition"], gap["first"], gap["end"]) == ("ctl", 0, 4, 6)
    assert later["-2"] == 7 and later["0"] == 9
    g = Gap.of(gap)
    assert g.covers(control_partition(0)) and not g.covers(0), "a control gap covers no events partition"
    assert Gap.of({**gap, "control": False}).covers(0) and not Gap.of({**gap, "control": False}).covers(control_partition(0))


def test_the_security_pages_kafka_table_is_settings_whose_secrets_hide(tmp_path: Path) -> None:
    from safepoint.settings import Secret, load_settings

    from doc_blocks import block

    path = tmp_path / "safepoint.toml"
    path.write_text(block("docs/security.md", "[kafka]").text)
    settings = load_settings(path, environ={})
    conf = settings.librdkafka()  # what every client is given
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert isinstance(settings.kafka["sasl.password"], Secret) and "..." not in repr(settings)


def test_the_operators_init_ends_in_one_line_when_the_jvm_is_gone(capsys: pytest.CaptureFixture[str]) -> None:
    """streaming/worker_daemon.py's hook for the driver-side init and the source's runner: a
    connection the JVM closed, and PySpark's own CANNOT_OPEN_SOCKET (a worker started as the JVM
    stops, which a SIGINT to the job's group once caught), each end in one line with no traceback;
    any other error, PySpark's or not, goes to the hook it wraps."""
    from pyspark.errors import PySparkRuntimeError

    from safepoint.streaming.worker_daemon import quiet_when_jvm_gone

    passed: list[BaseException] = []
    hook = quiet_when_jvm_gone(lambda kind, exc, tb: passed.append(exc))
    gone = PySparkRuntimeError(errorClass="CANNOT_OPEN_SOCKET", messageParameters={
        "errors": "[\"tried to connect to ('127.0.0.1', 1), but an error occurred: [Errno 104] Connection reset by peer\"]"})
    for exc in (EOFError(), BrokenPipeError(), gone):
        hook(type(exc), exc, None)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith("safepoint: the stateful operator's driver-side init ended")
                                   for line in lines), lines
    assert "CANNOT_OPEN_SOCKET" in lines[2]
    other = PySparkRuntimeError(errorClass="PYTHON_VERSION_MISMATCH",
                                messageParameters={"worker_version": "3.10", "driver_version": "3.11"})
    for exc in (other, ValueError("a real error")):
        hook(type(exc), exc, None)
    assert passed == [other, passed[1]] and isinstance(passed[1], ValueError)
    assert capsys.readouterr().err == ""

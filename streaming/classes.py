"""A class-data archive for Spark's JVM: the classes the job loads, mapped at start instead of read.

A fresh JVM spends seconds loading, parsing and verifying the few thousand classes of Spark,
Scala and the JDK that the job uses. A class-data archive (JDK 13+ ``-XX:ArchiveClassesAtExit``,
"dynamic CDS") holds them as the JVM had them in memory: a JVM started with it maps the archive
and skips that work. Measured on 2 cores: the session starts in 4.7-5.6 s instead of 8-9 s, the
query in 4.3-4.6 s instead of 6.1-6.6 s, and its first micro-batch about 2 s sooner.

``safepoint spark-classes`` (``devtools/spark_classes.py``) builds one by running the job for real
on the embedded broker (a few messages, one batch) in a child process whose JVM writes the archive
when it exits; ``scripts/setup.sh`` runs it once per machine. ``java_options`` gives the options that
use it to every Spark JVM the project starts (``session.build_session``), when it exists and was
made for this Java and this Spark; otherwise the JVM starts as before. The JVM checks the archive
itself and ignores one that does not match (``-Xshare:auto``): an archive can cost a start nothing
but its own speed.

``SAFEPOINT_SPARK_CLASSES`` names another archive path, or ``off`` to start without one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from safepoint.streaming.java import java_binary, java_version_text

__all__ = ["ENV", "archive_path", "java_options"]

ENV = "SAFEPOINT_SPARK_CLASSES"
_USE = "-XX:SharedArchiveFile={path} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def _key() -> str:
    """What an archive is bound to: the Java runtime, the Spark version and its jars."""
    import pyspark

    java = java_binary()
    version = java_version_text(java) if java else "?"
    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    text = json.dumps([version, pyspark.__version__, jars])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def archive_path() -> Path | None:
    """Where this Java and Spark's archive lives (None: ``SAFEPOINT_SPARK_CLASSES=off``)."""
    chosen = os.environ.get(ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    return Path(sys.prefix) / "share" / "safepoint" / f"spark-classes-{_key()}.jsa"


def java_options() -> str:
    """The JVM options that use the archive, or "" when there is none."""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return _USE.format(path=path)

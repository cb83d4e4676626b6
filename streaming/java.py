"""The Java that Spark starts: ``$JAVA_HOME/bin/java``, else the ``java`` on ``PATH``.

``session.check_java`` reads its version and ``classes`` binds the class-data archive to what it
prints; ``java -version`` runs once per process for both (it took 0.05-0.1 s a run here).
``C1_ONLY`` is the option for the project's short-lived JVMs.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

__all__ = ["C1_ONLY", "java_binary", "java_version_text"]

C1_ONLY = "-XX:TieredStopAtLevel=1"
"""The JVM option that compiles with C1 only: for JVMs that live seconds to minutes (the
class-data archive's one run, the tests' Spark JVMs), where C2's compiling is CPU spent for
nothing. The job itself keeps both compilers (its steady batches are faster with C2)."""


def java_binary() -> str | None:
    """The path of the java Spark will start, or None when there is none."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    return java if java and os.path.exists(java) else None


@functools.cache
def java_version_text(java: str) -> str:
    """What ``java -version`` prints ("" when it could not run)."""
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stderr + proc.stdout

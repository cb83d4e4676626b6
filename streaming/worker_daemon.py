"""The daemon Spark starts to fork its Python workers: PySpark's own, on the installed PySpark.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and Py4J's zip) first on every Python worker's
path. When Spark is the pip-installed PySpark, that zip is a copy of the very package installed
beside it, but Python cannot cache what it compiles from a zip: every daemon and every worker
compiled PySpark's modules again, about 0.7 CPU-s a process (``import pyspark.daemon`` 0.87 s from
the zip, 0.17 s from the installed package), a dozen processes for each query's start.

This module (``spark.python.daemon.module``, set by ``session.spark_conf``) drops those zips from
the path when the package they copy is installed and importable, then runs ``pyspark.daemon``;
its forked workers inherit the path. A zip of any other Spark (a cluster's own ``SPARK_HOME``)
stays first, as Spark meant. It must not import PySpark before the path is fixed, so it imports
nothing of this project either until then; after, it imports what every worker imports
(``preload``), once, before the first fork. Its workers end quietly when a stopping JVM drops
them before their first byte (``quiet_when_dropped``).

Spark starts a few Python processes without that setting (data source lookup, creation and read
planning through its own daemon, ``python -m pyspark.daemon``; the source's offset runner; the
operator's driver-side init): ``scripts/safepoint-spark-path.pth``, which ``scripts/setup.sh``
puts in the environment's site-packages, calls ``at_python_start`` when a Python of that
environment starts with a ``pyspark.zip`` on its path (any other start imports nothing of this
project). It drops the zips too, and in Spark's own daemon it has ``-m pyspark.daemon`` run this
module instead (``SparkDaemonRedirect``), without the preload: its workers end quietly as well.
The operator's driver-side init (``DRIVER_WORKER``) and the source's offset runner
(``SOURCE_RUNNER``) end quietly too when a stopping JVM closes their connection first
(``quiet_when_jvm_gone``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import signal
import socket
import sys
from collections.abc import Callable

__all__ = ["DRIVER_WORKER", "PRELOAD", "PRELOAD_ARROW", "QUIET_WHEN_JVM_GONE", "SOURCE_RUNNER", "THREAD_FREE_ENV", "SparkDaemonRedirect", "arrow_is_thread_free", "at_python_start",
           "drop_installed_copies", "installed_copies", "preload", "quiet_when_dropped", "quiet_when_jvm_gone", "redirect_once"]

DRIVER_WORKER = "pyspark.sql.streaming.transform_with_state_driver_worker"
"""The Python process Spark starts on the driver for the first batch of a query with a Python
``transformWithState``: it runs the processor's init against the JVM's state server."""

SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
"""The Python process Spark starts on the driver for a query's Python data source (the events
source): it answers the JVM's offset calls for the query's whole life."""

QUIET_WHEN_JVM_GONE = {DRIVER_WORKER: "the stateful operator's driver-side init",
                       SOURCE_RUNNER: "the events source's offset runner"}


def installed_copies(path: list[str]) -> list[str]:
    """The entries of ``path`` that are zips of a package installed on ``path`` itself: Spark's
    ``<site-packages>/pyspark/python/lib/{pyspark.zip,py4j-*.zip}``, also where they are named through
    a link (a ``SPARK_HOME`` that is a symbolic link to the installed PySpark, as the image's
    ``/opt/spark``: its zips were kept, and Spark's own daemon then failed, ``redirect_once``)."""
    dirs = {os.path.realpath(p) for p in path if p and os.path.isdir(p)}
    copies = []
    for entry in path:
        lib = os.path.dirname(os.path.realpath(entry)) if entry else ""
        name = os.path.basename(entry)
        if not (name.endswith(".zip") and lib.endswith(os.path.join("pyspark", "python", "lib"))):
            continue
        pyspark_dir = os.path.dirname(os.path.dirname(lib))
        site = os.path.realpath(os.path.dirname(pyspark_dir))
        package = "pyspark" if name == "pyspark.zip" else "py4j" if name.startswith("py4j") else None
        if package and site in dirs and os.path.isfile(os.path.join(site, package, "__init__.py")):
            copies.append(entry)
    return copies


def drop_installed_copies() -> None:
    """Drop from ``sys.path`` the zips ``installed_copies`` names."""
    drop = set(installed_copies(sys.path))
    sys.path[:] = [p for p in sys.path if p not in drop]
    for entry in drop:  # or every importlib.invalidate_caches() (a worker's first task) rereads the zip
        sys.path_importer_cache.pop(entry, None)


PRELOAD = ("pyspark.worker", "safepoint.streaming.processors")
"""What every forked worker imports anyway, imported once in the daemon instead (about 0.35 CPU-s
a worker, a dozen workers at a query's start): none of it starts a thread, which a fork must not
copy half-done."""

PRELOAD_ARROW = ("pyarrow", "pandas", "pyarrow.pandas_compat", "safepoint.streaming.source")
"""Imported too where they start no thread (``arrow_is_thread_free``): every worker of the job
imports pyarrow, and pandas with it (``pyarrow.array`` of a Python list imports pandas, and so
does PySpark's conversion of the operator's rows), about 0.9 CPU-s a worker, on batch 0's path."""

THREAD_FREE_ENV = {"JE_ARROW_MALLOC_CONF": "background_thread:false", "OPENBLAS_NUM_THREADS": "1"}
"""What keeps those imports to one thread: pyarrow's bundled jemalloc starts a background purge
thread when it loads (the default pool is mimalloc, which starts none), and numpy's OpenBLAS a
pool of threads unless told one (Spark sets ``OMP_NUM_THREADS`` for its workers, which OpenBLAS
also reads). Set where unset; the workers inherit them."""


def arrow_is_thread_free(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether ``environ`` keeps pyarrow and pandas from starting threads at import."""
    jemalloc = environ.get("JE_ARROW_MALLOC_CONF", "")
    blas = environ.get("OPENBLAS_NUM_THREADS") or environ.get("OMP_NUM_THREADS")
    return "background_thread:false" in jemalloc and blas == "1"


def preload() -> None:
    """Import ``PRELOAD`` (and ``PRELOAD_ARROW`` when ``arrow_is_thread_free`` after
    ``THREAD_FREE_ENV``), then freeze what is alive (``gcfreeze.freeze_once``, which the workers
    then count on: a worker freezes again only once it imported more), so the forked workers
    share those pages and PySpark's collection after every task does not walk them."""
    import importlib

    os.environ.setdefault("JE_ARROW_MALLOC_CONF", THREAD_FREE_ENV["JE_ARROW_MALLOC_CONF"])
    os.environ.setdefault("OPENBLAS_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", THREAD_FREE_ENV["OPENBLAS_NUM_THREADS"]))
    for name in PRELOAD:
        importlib.import_module(name)
    for name in PRELOAD_ARROW if arrow_is_thread_free(os.environ) else ():
        try:
            importlib.import_module(name)
        except ImportError:  # an executor without it: the worker that needs it says so, not the daemon
            continue
    from safepoint.gcfreeze import freeze_once

    freeze_once()


def quiet_when_dropped(worker: Callable[[socket.socket, bool], int]) -> Callable[[socket.socket, bool], int]:
    """``pyspark.daemon.worker`` (what a forked worker runs), but a worker whose connection the JVM
    closes before it sends the first byte ends quietly instead of printing a traceback.

    A stopping JVM drops the connection of a worker it has just asked the daemon for (a query's
    stop, a cancelled task), and PySpark's worker then dies reading the secret with a
    ``ConnectionResetError`` (or ``EOFError``) the daemon prints: noise in the job's log on a clean
    stop. The wrapper waits for that first byte without taking it (``MSG_PEEK``), under the signal
    handlers the worker itself sets first (the daemon's ignore SIGHUP, which is how it tells its
    workers to end); with none coming it returns 1, which the daemon takes as "do not reuse" and
    ends the process. Anything after the first byte, the secret's check and every task, is
    PySpark's as before, errors and all.
    """

    def wrapped(sock: socket.socket, authenticated: bool) -> int:
        if not authenticated:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                if not sock.recv(1, socket.MSG_PEEK):
                    return 1
            except ConnectionError:
                return 1
        return worker(sock, authenticated)

    return wrapped


def redirect_once() -> None:
    """Put a ``SparkDaemonRedirect`` first on ``sys.meta_path`` unless one is there. Python's site runs
    a path file once for a virtualenv's ``site-packages`` and again for the same directory among the
    site packages: where the zips stay on the path (another Spark's), the project's path file called
    ``at_python_start`` twice, the second redirect caught the daemon's own import of the real
    ``pyspark.daemon``, and the daemon died (``module 'pyspark.daemon' has no attribute 'worker'``):
    every Python data source lookup, and the job with it, failed."""
    if not any(isinstance(finder, SparkDaemonRedirect) for finder in sys.meta_path):
        sys.meta_path.insert(0, SparkDaemonRedirect())


class SparkDaemonRedirect:
    """A one-shot import finder: the lookup of ``pyspark.daemon`` that ``python -m pyspark.daemon``
    makes at its start finds this module under that name instead (run as ``__main__``, it wraps the
    real ``pyspark.daemon``'s worker and runs its manager); it then leaves ``sys.meta_path``, so
    every later import of ``pyspark.daemon`` is PySpark's own."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pyspark.daemon":
            return None
        sys.meta_path.remove(self)
        return importlib.util.spec_from_file_location("pyspark.daemon", __file__)


def quiet_when_jvm_gone(hook: Callable[..., object], what: str = QUIET_WHEN_JVM_GONE[DRIVER_WORKER]) -> Callable[..., None]:
    """``sys.excepthook`` for ``DRIVER_WORKER`` and ``SOURCE_RUNNER`` (``what`` names it): a
    connection the JVM closed (``EOFError`` reading the JVM's next call, then ``BrokenPipeError``
    writing the error back) ends the process with one line instead of two tracebacks; any other
    exception goes to ``hook`` as before.

    A query stopped while its first batch starts (SIGTERM or SIGINT to the job's process group in
    the middle of the operator's init) closes that connection; PySpark's worker reports the
    ``EOFError`` on the socket that is gone and dies of the ``BrokenPipeError``, whose traceback
    (with the first as its context) was all the job's log said of a clean stop. The source's runner
    does the same when the JVM goes while it answers a call (a full-suite run caught it too, at the
    same moment), and a worker started just as the JVM stops finds no one to connect to (PySpark's
    ``CANNOT_OPEN_SOCKET``, a reset connection: caught once with SIGINT). The JVM decides what a
    failed call means: it reads the connection, not this process's stderr.
    """

    def excepthook(kind: type[BaseException], exc: BaseException, tb: object) -> None:
        if issubclass(kind, (ConnectionError, EOFError)):
            sys.stderr.write(f"safepoint: {what} ended: the JVM closed its connection ({kind.__name__}), "
                             f"as a stopping query does\n")
            return
        if _condition(exc) == "CANNOT_OPEN_SOCKET":
            sys.stderr.write(f"safepoint: {what} ended: the JVM was gone before it connected (CANNOT_OPEN_SOCKET), "
                             f"as a stopping query's is\n")
            return
        hook(kind, exc, tb)

    return excepthook


def _condition(exc: BaseException) -> str | None:
    """PySpark's error condition of ``exc`` (``CANNOT_OPEN_SOCKET``, ...), None for another exception."""
    condition = getattr(exc, "getCondition", None)
    found = condition() if callable(condition) else None
    return found if isinstance(found, str) else None


def at_python_start() -> None:
    """What ``scripts/safepoint-spark-path.pth`` runs in a Python started with Spark's zips on its
    path: drop the installed copies, in Spark's own daemon redirect it here, and in the operator's
    driver-side init and the source's runner end quietly when the JVM goes first."""
    drop_installed_copies()
    argv = getattr(sys, "orig_argv", [])[1:3]
    if argv == ["-m", "pyspark.daemon"]:
        redirect_once()
    elif len(argv) == 2 and argv[0] == "-m" and argv[1] in QUIET_WHEN_JVM_GONE:
        sys.excepthook = quiet_when_jvm_gone(sys.excepthook, QUIET_WHEN_JVM_GONE[argv[1]])


def main(preloaded: bool = True) -> None:
    drop_installed_copies()
    if preloaded:
        preload()
    import pyspark.daemon

    pyspark.daemon.worker = quiet_when_dropped(pyspark.daemon.worker)  # type: ignore[assignment]
    pyspark.daemon.manager()


if __name__ == "__main__":
    # run as Spark's daemon module, or as ``pyspark.daemon`` itself (``SparkDaemonRedirect``):
    # only the job's workers use what the preload imports
    main(preloaded=__spec__ is None or __spec__.name != "pyspark.daemon")

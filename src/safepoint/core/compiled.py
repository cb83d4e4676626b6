"""Which core runs: the compiled one, or these modules as plain Python.

``scripts/build_core.py`` (run by ``scripts/setup.sh``) compiles the core's modules with mypyc
into ``build/core/`` of the checkout and writes there the digest of the sources it compiled.
``select`` (called by ``safepoint/core/__init__.py`` before any module of the core is imported)
puts that directory first on the package's path when the build is there and its digest is the one
of the sources now: the compiled modules then shadow the ``.py`` files. A build of other sources
(a module edited since) is never used, so what runs is always what the sources say.

``SAFEPOINT_CORE`` chooses: ``auto`` (the default: compiled when current, else Python),
``python`` (never compiled: to compare, or to debug with Python's tools) or ``compiled`` (an
error when the build is missing or out of date).
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path

__all__ = ["BUILD", "GROUP", "PLAIN", "compiled_modules", "digest", "select"]

HERE = Path(__file__).resolve().parent
BUILD = HERE.parents[2] / "build" / "core"
"""Where ``scripts/build_core.py`` puts the build (``build/core`` of the checkout)."""
PLAIN = frozenset({"__init__", "alert_kinds", "compiled", "event_records", "event_structs", "fastcheck", "jsonfloat",
                   "policy"})
"""Modules that stay Python: this one and the package (they choose), ``alert_kinds`` and
``event_records`` (type declarations only, written from the schemas: no code runs on them, and a
compiled ``TypedDict`` keeps no ``__required_keys__``),
``event_structs`` (msgspec structs, which mypyc cannot compile; the compiled code reads their
attributes), ``fastcheck`` (it writes Python at run time), ``jsonfloat`` (a subclass of ``str``, which mypyc
cannot compile) and ``policy`` (a compiled class checks its fields' types before ``__post_init__``
can say which setting is wrong)."""
GROUP = "safepoint.core._compiled"
"""The build's group: its shared library is the module ``GROUP + "__mypyc"``, inside the package so
that the package's path finds it."""
STAMP = "SOURCES"
"""The file of the build holding the digest of the sources it was compiled from."""


def compiled_modules(src: Path = HERE) -> list[str]:
    """The names of the core's modules the build compiles, sorted."""
    return sorted(p.stem for p in src.glob("*.py") if p.stem not in PLAIN)


def digest(src: Path = HERE) -> str:
    """The SHA-256 of the compiled modules' names and sources."""
    h = hashlib.sha256()
    for name in compiled_modules(src):
        h.update(name.encode() + b"\0" + (src / f"{name}.py").read_bytes() + b"\0")
    return h.hexdigest()


def select(path: list[str], build: Path = BUILD, src: Path = HERE, mode: str | None = None) -> tuple[str, str]:
    """Put the compiled modules first on ``path`` (the package's ``__path__``) when they may run.
    Returns (``"compiled"`` or ``"python"``, why)."""
    mode = (mode if mode is not None else os.environ.get("SAFEPOINT_CORE", "auto")).strip().lower() or "auto"
    if mode not in ("auto", "python", "compiled"):
        msg = f"SAFEPOINT_CORE must be auto, python or compiled, not {mode!r}"
        raise ValueError(msg)
    if mode == "python":
        return "python", "SAFEPOINT_CORE=python"
    lib = build / "safepoint" / "core"
    stamp = build / STAMP
    if not stamp.is_file():
        why = f"no compiled build at {build} (scripts/build_core.py makes it)"
    elif stamp.read_text().strip() != digest(src):
        why = f"the compiled build at {build} is of other sources (scripts/build_core.py rebuilds it)"
    else:
        path.insert(0, str(lib))
        try:
            importlib.import_module(f"{GROUP}__mypyc")
        except ImportError as e:
            path.remove(str(lib))
            why = f"the compiled build at {build} does not load: {e}"
        else:
            return "compiled", f"compiled by mypyc ({build})"
    if mode == "compiled":
        msg = f"SAFEPOINT_CORE=compiled, but {why}"
        raise ImportError(msg)
    return "python", why

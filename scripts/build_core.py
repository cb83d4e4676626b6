"""Compile the core's modules with mypyc into build/core/ (``safepoint/core/compiled.py`` says when
they run). Quick when the build is current; ``--force`` rebuilds. Exits 0 with a message and no
build where there is no C compiler or mypyc: the core then runs as Python.

The C files compile in parallel, one per core (setuptools compiles one extension's sources one
after the other): about 30 s on 2 cores instead of about 60.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def _compiled_core() -> Any:
    """``safepoint/core/compiled.py`` loaded alone: importing ``safepoint.core`` would select (and
    load) the build this script may be about to replace."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_safepoint_core_compiled", SRC / "safepoint" / "core" / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parallel_compile(jobs: int) -> None:
    """Make setuptools compile an extension's C files ``jobs`` at a time."""
    from setuptools._distutils import ccompiler

    def compile_(self: Any, sources: list[str], output_dir: str | None = None, macros: Any = None,
                 include_dirs: Any = None, debug: bool = False, extra_preargs: Any = None,
                 extra_postargs: Any = None, depends: Any = None) -> list[str]:
        macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj: str) -> None:
            src, ext = build[obj]
            self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, objects))
        return list(objects)

    ccompiler.CCompiler.compile = compile_


def build(force: bool, jobs: int, opt: str) -> int:
    core = _compiled_core()
    out: Path = core.BUILD
    want = core.digest()
    stamp = out / core.STAMP
    if not force and stamp.is_file() and stamp.read_text().strip() == want:
        print(f"build_core: {out} is current")
        return 0
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        print("build_core: no C compiler (cc): the core runs as Python", file=sys.stderr)
        return 0
    try:
        from mypyc.build import mypycify
        from setuptools import setup
    except ImportError as e:
        print(f"build_core: mypyc is not installed ({e}): the core runs as Python", file=sys.stderr)
        return 0
    started = time.monotonic()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    os.environ["MYPY_CACHE_DIR"] = str(out / "mypy-cache")
    paths = [f"safepoint/core/{name}.py" for name in core.compiled_modules()]
    cwd = os.getcwd()
    os.chdir(SRC)  # mypyc names modules by their paths
    try:
        extensions = mypycify(paths, opt_level=opt, multi_file=True, group_name=core.GROUP, target_dir=str(out / "c"))
        for ext in extensions:  # multi-file mode writes the group's headers under its package, not on the include path
            ext.include_dirs.append(str(out / "c" / "safepoint" / "core"))
        _parallel_compile(jobs)
        setup(name="safepoint-core", ext_modules=extensions,
              script_args=["-q", "build_ext", "--build-lib", str(out), "--build-temp", str(out / "obj")])
    finally:
        os.chdir(cwd)
    if core.digest() != want:
        print("build_core: the sources changed during the build; run it again", file=sys.stderr)
        return 1
    for part in ("c", "obj", "mypy-cache"):  # the generated C, the objects, mypy's cache: not needed to run
        shutil.rmtree(out / part, ignore_errors=True)
    stamp.write_text(want + "\n")
    print(f"build_core: {len(paths)} modules compiled into {out} in {time.monotonic() - started:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the build is current")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="C files compiled at once (default: the cores)")
    ap.add_argument("--opt", default="3", help="the C compiler's optimization level (default 3)")
    args = ap.parse_args(argv)
    return build(args.force, max(1, args.jobs), args.opt)


if __name__ == "__main__":
    sys.exit(main())

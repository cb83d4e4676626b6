"""The compiled core (``scripts/build_core.py``, ``safepoint/core/compiled.py``): the tests run it
where it is built, it makes what the core as Python makes, and a build of other sources never runs."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import safepoint.core
from safepoint.core import compiled
from safepoint.core.compiled import compiled_modules, digest, select

HERE = Path(__file__).resolve().parent
BUILT = (compiled.BUILD / compiled.STAMP).is_file()


def need_build() -> None:
    if os.environ.get("SAFEPOINT_CORE", "").strip().lower() == "python":
        pytest.skip("SAFEPOINT_CORE=python: these tests run with the core as Python")
    if not BUILT:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the compiled core, but there is no build at {compiled.BUILD} (.venv/build-core.log)")
        pytest.skip("the core is not compiled here (scripts/build_core.py)")


def test_the_tests_run_the_compiled_core_where_it_is_built() -> None:
    need_build()
    assert safepoint.core.CORE == "compiled", safepoint.core.CORE_WHY
    for name in compiled_modules():
        module = importlib.import_module(f"safepoint.core.{name}")
        assert str(module.__file__).endswith(".so"), f"safepoint.core.{name} runs from {module.__file__}"
    fastcheck = importlib.import_module("safepoint.core.fastcheck")
    assert str(fastcheck.__file__).endswith(".py"), "fastcheck writes Python at run time: it stays Python"


def outputs(mode: str) -> dict[str, object]:
    env = {**os.environ, "SAFEPOINT_CORE": mode}
    done = subprocess.run([sys.executable, str(HERE / "core_outputs.py")], env=env, cwd=HERE, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_compiled_core_makes_what_the_core_as_python_makes() -> None:
    """The examples through replay, and generated logs through the job's batch logic and replay:
    every output, status part, accounting row and the final status, byte for byte."""
    need_build()
    as_python, as_compiled = outputs("python"), outputs("compiled")
    assert (as_python["core"], as_compiled["core"]) == ("python", "compiled")
    assert int(str(as_python["made"])) > 10_000
    assert as_compiled == {**as_python, "core": "compiled"}


def test_a_build_of_other_sources_never_runs(tmp_path: Path) -> None:
    path: list[str] = []
    assert select(path, build=tmp_path, mode="auto")[0] == "python" and path == []
    (tmp_path / compiled.STAMP).write_text("0" * 64 + "\n")
    kind, why = select(path, build=tmp_path, mode="auto")
    assert (kind, path) == ("python", []) and "other sources" in why
    with pytest.raises(ImportError, match="other sources"):
        select(path, build=tmp_path, mode="compiled")
    assert select(path, build=tmp_path, mode="python") == ("python", "SAFEPOINT_CORE=python")
    with pytest.raises(ValueError, match="SAFEPOINT_CORE"):
        select(path, build=tmp_path, mode="fast")


def test_the_digest_covers_every_compiled_module_and_nothing_else(tmp_path: Path) -> None:
    for name in ("node", "fastcheck"):
        (tmp_path / f"{name}.py").write_text("x = 1\n")
    before = digest(tmp_path)
    (tmp_path / "fastcheck.py").write_text("x = 2\n")
    assert digest(tmp_path) == before, "fastcheck stays Python: not part of the build"
    (tmp_path / "node.py").write_text("x = 2\n")
    assert digest(tmp_path) != before
    assert compiled_modules(tmp_path) == ["node"]


def test_a_build_that_does_not_load_is_left_for_python(tmp_path: Path) -> None:
    """A current stamp whose libraries do not load (here: none there) falls back to Python, or
    refuses under ``SAFEPOINT_CORE=compiled``. In a fresh interpreter whose core runs as Python,
    so that no compiled library is loaded already."""
    (tmp_path / compiled.STAMP).write_text(digest() + "\n")
    script = f"""
import pytest
from safepoint.core.compiled import select
path = []
kind, why = select(path, build=__import__("pathlib").Path({str(tmp_path)!r}), mode="auto")
assert (kind, path) == ("python", []) and "does not load" in why, (kind, path, why)
with pytest.raises(ImportError, match="does not load"):
    select(path, build=__import__("pathlib").Path({str(tmp_path)!r}), mode="compiled")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "SAFEPOINT_CORE": "python"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]

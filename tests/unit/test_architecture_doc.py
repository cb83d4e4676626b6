"""docs/architecture.md stays true: it names every module of the project's packages and every file it
names exists. (A module's size follows its noun, not a line cap: the house style.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = [ROOT / "src" / "safepoint", ROOT / "streaming", ROOT / "connectors", ROOT / "benchmarks"]


def modules() -> list[Path]:
    return sorted(p for d in PACKAGES for p in d.rglob("*.py") if p.name != "__init__.py")


def test_the_architecture_page_names_every_module() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [str(p.relative_to(ROOT)) for p in modules() if p.stem not in text]
    assert not missing, f"docs/architecture.md does not mention {missing}"


def test_every_file_the_architecture_page_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"\b((?:core|streaming|connectors|ops|devtools|src/safepoint)/[a-z_/]+\.py)\b", text))
    assert named, "the page names files"
    roots = [ROOT, ROOT / "src" / "safepoint"]
    gone = sorted(n for n in named if not any((r / n).exists() for r in roots))
    assert not gone, f"docs/architecture.md names files that do not exist: {gone}"

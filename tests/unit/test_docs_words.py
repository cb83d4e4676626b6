"""The docs and the command help speak of the product: sources by their public names (not the
project's internal seed numbers), and no word of the project's issue tracker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from safepoint.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = re.compile(r"\bseed \d{3}\b|\bseeds?/|\bissues?\b", re.IGNORECASE)


def help_texts() -> list[str]:
    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        texts += [sub.format_help() for sub in action.choices.values()]
    return texts


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "schemas/examples/README.md",
                                  ROOT / "examples/README.md"],
                         ids=lambda p: p.name)
def test_docs_cite_sources_by_public_name(path: Path) -> None:
    found = [m.group(0) for m in FORBIDDEN.finditer(path.read_text(encoding="utf-8"))]
    assert found == [], f"{path.name}: {found}"


def test_help_text_mentions_no_issue() -> None:
    texts = help_texts()
    assert len(texts) > 8
    for text in texts:
        assert not FORBIDDEN.search(text), text

"""The project stands alone (docs/contributing.md, rule 22): nothing in it cites a file outside the
repository, and every Markdown link between its pages leads to a file that is there."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"STYLE\.md|CONTRACT\.md|\.\./shared|shared/seeds")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if p.endswith((".py", ".md", ".toml", ".sh", ".yaml", ".cfg", ".txt"))]


def test_nothing_cites_a_file_outside_the_repository() -> None:
    me = Path(__file__).resolve()
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in tracked() if p.resolve() != me and p.exists()
             for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if OUTSIDE.search(line)]
    assert found == [], "\n".join(found[:10])


def test_every_link_between_the_pages_leads_somewhere() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "README.md"]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == [], broken


def test_the_alert_reference_has_a_row_for_every_kind_the_schema_names() -> None:
    """Alerts are typed kinds (``schemas/outputs/alert.json``'s ``kind``: an alert of another kind
    fails every test that checks outputs against the schemas); the guide says each one's meaning."""
    from safepoint.schemas import ALERT_KINDS

    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    table = text[text.index("| kind | severity | raised when | cleared when |"):]
    rows = [line.split("`")[1] for line in table.splitlines()[2:] if line.startswith("| `")]
    end = next((i for i, line in enumerate(table.splitlines()[2:]) if not line.startswith("|")), None)
    rows = [line.split("`")[1] for line in table.splitlines()[2:2 + end] if line.startswith("| `")] if end else rows
    assert sorted(rows) == sorted(ALERT_KINDS)

"""Every code block of the README and the guides is run by a test (or is a diagram or lines a
command printed, said so): a block added without a test, or a test that stopped taking its block
from the doc, fails here."""

from __future__ import annotations

import ast
import shlex

from doc_blocks import CLAIMS, DOCS, ROOT, block, blocks


def test_every_block_is_claimed_once_and_every_claim_finds_its_block() -> None:
    found = {(b.doc, b.first): b for doc in DOCS for b in blocks(doc)}
    unclaimed = [f"{doc}:{b.line}: {first[:60]}" for (doc, first), b in found.items()
                 if not any(d == doc and first.startswith(p) for d, p in CLAIMS)]
    assert unclaimed == [], "blocks no test runs (add the test and a CLAIMS entry in tests/doc_blocks.py)"
    for doc, prefix in CLAIMS:
        block(doc, prefix)  # exactly one block each


def test_each_claimed_test_exists_and_takes_its_block_from_the_doc() -> None:
    for (doc, prefix), where in CLAIMS.items():
        if where.startswith("shown: "):
            continue
        path, name = where.split("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        tree = ast.parse(source)
        funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in funcs, f"{where} does not exist"
        if name == "test_ci_runs_the_readmes_test_command":
            continue
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "block"]
        args = [[a.value for a in c.args if isinstance(a, ast.Constant)] for c in calls]
        assert [doc, prefix] in args, f"{path} does not take {doc}'s block {prefix!r} with block(...)"


def test_ci_runs_the_readmes_test_command() -> None:
    command = block("README.md", "./scripts/test.sh").text.strip()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    runs = [shlex.split(ln) for ln in ci if ln.startswith("exec ")]
    assert runs and runs[-1][1] == command, f".ci/run must run the README's test command {command!r}: {runs}"

"""The layout by its imports (read with ``ast``, nothing is imported): which part of the project may
import which, what the node client leaves out, and the import circles left inside the core.

The parts, bottom up: ``errors`` and ``schemas``; the pure ``core``; ``settings``; the ``connectors``
(Kafka, the node client); the ``streaming`` job; what operators run (``ops``); what developers run
(``devtools``) and the commands on top.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = {"core": ROOT / "src/safepoint/core", "connectors": ROOT / "connectors", "streaming": ROOT / "streaming",
         "ops": ROOT / "src/safepoint/ops", "devtools": ROOT / "src/safepoint/devtools"}
TOP = ROOT / "src/safepoint"

ALLOWED = {
    "errors": set(),
    "core": {"errors", "schemas"},
    "settings": {"core", "errors"},
    "connectors": {"core", "errors", "schemas", "settings", "gcfreeze"},
    "streaming": {"core", "connectors", "errors", "settings", "gcfreeze", "jars"},
    "jars": {"errors"},
    "replay": {"core", "errors", "settings"},
    "checknode": {"core", "connectors", "errors", "settings"},
    "ops": {"core", "connectors", "streaming", "errors", "schemas", "settings"},
}
"""Which parts each part may import (``devtools`` and ``cli`` sit on top and may import any): what
operators run never needs what developers run."""

NODE_CLIENT = ["reporter", "sender", "handles", "registration", "admission", "heartbeat", "incarnation", "expiry", "listener",
               "directive_models", "node_directives", "service_hold", "actions", "kafka/follow", "kafka/idle",
               "kafka/clients", "kafka/producer", "kafka/topics"]
"""The connectors a database node runs (``pip install safepoint`` without extras): the node client, and
the Kafka plumbing it shares (``connectors/kafka/``)."""
HEAVY = {"pyspark", "pyarrow", "pandas", "fastapi", "uvicorn", "starlette", "prometheus_client", "rich", "noida_db",
         "psutil"}




def imports(path: Path) -> Iterator[str]:
    """Every absolute module name ``path`` imports, at the top or inside a function."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def part_of(module: str) -> str | None:
    """The part of ours ``module`` belongs to (``safepoint.core.cluster`` -> ``core``), None for others."""
    parts = module.split(".")
    if parts[0] != "safepoint" or len(parts) < 2:
        return None
    return parts[1]


def modules_of(part: str) -> list[Path]:
    if part in PARTS:
        return sorted(PARTS[part].rglob("*.py"))  # connectors/kafka/ too
    return [TOP / f"{part}.py"]


def test_each_part_imports_only_the_parts_below_it() -> None:
    wrong = []
    for part, allowed in ALLOWED.items():
        for path in modules_of(part):
            for module in imports(path):
                other = part_of(module)
                if other is not None and other != part and other not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not wrong, wrong


def test_the_core_imports_no_kafka_spark_or_clock_library() -> None:
    banned = {"pyspark", "confluent_kafka", "kafka", "pyarrow", "pandas", "fastapi", "uvicorn", "time", "datetime"}
    found = [f"{p.name}: {m}" for p in modules_of("core") for m in imports(p) if m.split(".")[0] in banned]
    assert not found, found


def test_the_node_client_needs_no_spark_and_no_web_server() -> None:
    """What a database node embeds imports none of the extras, not even lazily; the core it uses
    neither (the bare install is tested for real in tests/integration/test_bare_install.py)."""
    paths = [PARTS["connectors"] / f"{name}.py" for name in NODE_CLIENT] + modules_of("core")
    assert all(p.exists() for p in paths)
    found = [f"{p.relative_to(ROOT)}: {m}" for p in paths for m in imports(p) if m.split(".")[0] in HEAVY]
    assert not found, found
    inside = [f"{p.name}: {m}" for p in paths[: len(NODE_CLIENT)] for m in imports(p)
              if m.startswith("safepoint.connectors.") and m.removeprefix("safepoint.connectors.").replace(".", "/")
              not in NODE_CLIENT]
    assert not inside, f"the node client imports connectors outside it: {inside}"


def core_circles() -> list[set[str]]:
    mods = {p.stem for p in modules_of("core")}
    deps = {m: {mod.split(".")[2] for mod in imports(PARTS["core"] / f"{m}.py")
                if mod.startswith("safepoint.core.") and mod.split(".")[2] in mods} for m in mods}
    reach: dict[str, set[str]] = {}
    for m in mods:  # what m reaches (small graph: a walk per module)
        seen, todo = set(), list(deps[m])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(deps[n])
        reach[m] = seen
    circles: list[set[str]] = []
    for m in sorted(mods):
        group = {m} | {n for n in reach[m] if m in reach[n]}
        if len(group) > 1 and group not in circles:
            circles.append(group)
    return circles


def test_no_import_circle_in_the_core() -> None:
    """The state's parts (members, alerts, control, tenants, directives, recovery, pressure, leaks)
    take what they need and never import the state that composes them (type-only imports count)."""
    circles = core_circles()
    assert not circles, f"import circles in the core: {circles}"

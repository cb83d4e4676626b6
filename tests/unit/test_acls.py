"""The security page's ACL table is ``connectors/kafka/acls.py``'s roles, and its ``safepoint acls`` line
prints what a node may do on the default topics (the grants themselves run on Apache Kafka with SASL in
tests/integration/test_kafka_acls.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from safepoint.cli import main as cli
from safepoint.connectors.kafka.acls import ROLES, bindings
from safepoint.errors import ConfigError
from safepoint.settings import Settings

from doc_blocks import block

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"`safepoint.events`": ["events"], "`safepoint.control`": ["control"], "`safepoint.directives`": ["directives"],
        "`safepoint.alerts`, `safepoint.deadletter`": ["alerts", "deadletter"], "`safepoint.status`": ["status"]}


def table() -> dict[str, dict[str, set[str]]]:
    """Role -> topic key -> operations, read from the security page's table."""
    text = (ROOT / "docs" / "security.md").read_text()
    out: dict[str, dict[str, set[str]]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[3] or cells[0] in ("topic", "---"):
            continue
        keys = KEYS.get(cells[0], ["accounting"] if "accounting" in cells[0] else None)
        assert keys, cells[0]
        for grant in cells[3].split(";"):
            found = re.fullmatch(r"\s*((?:`\w+`(?:, )?)+): ([A-Z, ]+?)\s*", grant.replace("**never nodes**", ""))
            if found is None:
                assert "never nodes" in grant, grant
                continue
            for role in re.findall(r"`(\w+)`", found.group(1)):
                for key in keys:
                    out.setdefault(role, {}).setdefault(key, set()).update(op.strip() for op in found.group(2).split(","))
    return out


def test_the_security_pages_table_is_the_roles_acls() -> None:
    assert table() == {role: {key: set(ops) for key, ops in grants} for role, grants in ROLES.items()}


def test_no_role_but_the_job_writes_directives_and_no_node_writes_control() -> None:
    topics = Settings().topics()
    for role in ROLES:
        writes = {topic for topic, op in bindings(role, "User:x", topics) if op == "WRITE"}
        assert (topics["directives"] in writes) == (role == "job"), role
        assert (topics["control"] in writes) == (role in ("operator", "holder")), role


def test_the_pages_acls_line_prints_a_nodes_grants(capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(block("docs/security.md", ".venv/bin/safepoint acls").text)
    assert argv[:2] == [".venv/bin/safepoint", "acls"]
    assert cli(argv[1:]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "kafka-acls.sh --bootstrap-server kafka:9092 --add --allow-principal User:db-node-7 --operation WRITE --topic safepoint.events",
        "kafka-acls.sh --bootstrap-server kafka:9092 --add --allow-principal User:db-node-7 --operation READ --topic safepoint.directives",
    ]


def test_a_principal_and_a_role_are_checked() -> None:
    with pytest.raises(ConfigError, match="User:NAME"):
        bindings("node", "db-node-7", Settings().topics())
    with pytest.raises(ConfigError, match="unknown role"):
        bindings("admin", "User:x", Settings().topics())

"""A new kind of hold is one ``HoldKind`` and one ``register`` (``core/holds.py``): the node's rules
walk it with no other change to the core (``docs/architecture.md``, "Adding a kind of hold").

The kind is registered in a process of its own, so that no other test meets it. Its events are
applied as validated events (``Engine.apply``) and the outputs are not held to their schemas: on
the wire its events and its name in the outputs would need their schemas first, which the
architecture page lists with the client's calls.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from safepoint.core.holds import EVENTS, HELD_AS, HELD_KINDS, KINDS, HoldKind, register

from doc_blocks import ROOT, block

HERE = Path(__file__).resolve().parent

SCRIPT = r'''
import json

from safepoint.core.holds import HoldKind, register

LEASE = register(HoldKind("lease", "lease", "lease(s)", "lease_grant", "lease_revoke", "lease_id", "lease_ts",
                          "leases", "active_leases", False))

from safepoint.core import NodeState, Policy
from safepoint.core.status import node_status
import core_helpers
from core_helpers import NodeClient, Run, alerts, topology

core_helpers.check_output = lambda out: None  # the outputs' schemas would list the new kind first

W = 1_700_000_000_000
policy = Policy(leak_window_ms=1_000)
run = Run(policy)
n1 = NodeClient("n1", "default")


def apply(ev):
    """A validated event of the new kind (the wire would need its schema first)."""
    outcome = run.engine.apply(ev, 0, run.offset)
    run.offset += 1
    run.outputs.extend(outcome.outputs)
    assert outcome.label == "applied", outcome.label
    return outcome.outputs


run.feed(topology(1, W, {"n1": []}, "default"))
apply(n1.event("lease_grant", W + 1, lease_id="l1", lease_ts=300, label="etcd lease 7"))
run.feed(n1.open("r1", 500, W + 2), n1.hb(W + 3, 1_000))
[d] = run.directives()
assert d["safe_ts"] == 300 and d["blocker"]["kind"] == "lease" and d["blocker"]["id"] == "l1", d
assert d["blocker"]["label"] == "etcd lease 7", d

node = run.engine.nodes[("default", "n1")]
status = node_status(node, policy)
assert status["open"] == {"reader": 1, "tx": 0, "lease": 1, "prepared_tx": 0}, status["open"]
assert [(h["kind"], h["id"]) for h in status["holds"]] == [("lease", "l1"), ("reader", "r1")], status["holds"]

run.restore()  # the stored form carries it (in its more_holds field: no layout changed)
node = run.engine.nodes[("default", "n1")]
assert set(node.holds.of("lease")) == {"l1"}
assert node.to_stored()[-1] == {"lease": {"l1": [300, W + 1, "etcd lease 7", 0]}}, node.to_stored()[-1]

apply(n1.event("lease_grant", W + 4, lease_id="l2", lease_ts=800))  # above the lowest: nothing moves
assert run.last_safe_ts() == 300

apply(n1.hb(W + 10, 1_000, active_readers=1, active_txs=0, active_leases=0))
apply(n1.hb(W + 2_000, 1_000, active_readers=1, active_txs=0, active_leases=0))
[leak] = alerts(run.outputs, "leaked_hold", "raised")
assert "2 lease(s)" in leak["detail"] and "lease l1, lease l2" in leak["detail"], leak["detail"]

apply(n1.event("snapshot", W + 2_001, cut=0, readers=[{"reader_id": "r1", "read_ts": 500}], txs=[],
               leases=[{"lease_id": "l2", "lease_ts": 800}]))
assert set(run.engine.nodes[("default", "n1")].holds.of("lease")) == {"l2"}
assert run.last_safe_ts() == 500 and run.directives()[-1]["blocker"]["kind"] == "reader"
assert alerts(run.outputs, "leaked_hold", "cleared")

apply(n1.event("lease_revoke", W + 2_002, lease_id="l2"))
run.feed(n1.close("r1", W + 2_003), n1.hb(W + 2_004, 1_000))
assert run.last_safe_ts() == 1_000 and not run.engine.nodes[("default", "n1")].open_holds()
parts = [{"readers": [{"reader_id": "r2", "read_ts": 1_200}], "txs": [], "leases": []},
         {"readers": [], "txs": [], "leases": [{"lease_id": "l3", "lease_ts": 1_300}]}]
for i, part in enumerate(parts):  # a snapshot in two parts: each kind's lists are gathered across them
    apply(n1.event("snapshot", W + 2_005 + i, cut=1, part=i, parts=2, **part))
node = run.engine.nodes[("default", "n1")]
assert set(node.holds.of("reader")) == {"r2"} and set(node.holds.of("lease")) == {"l3"}, node.open_holds()
print("ok", json.dumps(run.directives()[-1]["blocker"]))
'''


def test_a_registered_kind_of_hold_is_walked_by_every_rule() -> None:
    """Registered, a lease (a timestamp a node holds for a granted lease) holds the safe point and is
    its blocker with its label, is counted and listed in the node's status, survives the stored form,
    moves nothing when granted above the lowest hold, is counted by the leak watch against the heartbeat's
    count of it, is restated by a snapshot's list of it (whole or in parts), and its closing releases
    the node."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=HERE, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.startswith("ok"), done.stdout


def test_a_kind_cannot_take_what_another_kind_has() -> None:
    """Registration refuses a kind whose name, events, id field or snapshot list a kind has already."""
    before = (list(KINDS), dict(EVENTS), dict(HELD_AS), list(HELD_KINDS))
    with pytest.raises(ValueError, match="its name, opening event, closing event, id field, snapshot list"):
        register(HoldKind("reader", "reader", "reader(s)", "reader_open", "reader_close", "reader_id", "read_ts",
                          "readers", "active_readers", False))
    with pytest.raises(ValueError, match="its closing event belong"):
        register(HoldKind("slot", "slot", "slot(s)", "slot_open", "tx_end", "slot_id", "slot_ts", "slots",
                          "active_slots", False))
    assert (list(KINDS), dict(EVENTS), dict(HELD_AS), list(HELD_KINDS)) == before, "a refused kind changed nothing"


def test_the_architecture_pages_registration_is_the_codes() -> None:
    """The page's example of a registration is the line in ``core/holds.py`` that registers transactions."""
    shown = block("docs/architecture.md", "TX = register(").text
    assert shown in (ROOT / "src/safepoint/core/holds.py").read_text(encoding="utf-8")

"""Signed directives and the job's generation (``core/signing.py``, ``core/directives.py``): the job signs
every directive with the first of ``directive_keys`` and stamps its generation; a listener given the
public keys acts on none that no key signed, and takes a new generation up only where the node's safe
point would not go back; the etcd agent's compactor likewise never goes below what the store compacted.
The same through a broker and a real etcd: tests/integration/test_signed_directives_e2e.py."""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass
from typing import Any

import pytest

from safepoint.cli import main as cli
from safepoint.connectors.etcd_agent import Compactor
from safepoint.connectors.listener import DirectiveListener
from safepoint.core.policy import Policy
from safepoint.core.signing import directive_canonical, public_key_of, sign_directive, verify_directive
from safepoint.errors import ConfigError

from core_helpers import NodeClient, Run, check_output, topology
from doc_blocks import block

T0 = 1_700_000_000_000
OLD, NEW, ROGUE = "11" * 32, "22" * 32, "33" * 32


def test_the_job_signs_every_directive_and_stamps_its_generation() -> None:
    run = Run(node_lease_ms=10_000, directive_keys=f"{NEW},{OLD}", generation="g-2")
    n1 = NodeClient("n1", "c1")
    out = run.feed(topology(1, T0, {"n1": []}, cluster="c1"), n1.hb(T0, 1_000), n1.open("r", 900, T0 + 1),
                   n1.hb(T0 + 2, 2_000))
    sent = [o for o in out if o.channel == "directives"]
    assert {o.value["type"] for o in sent} >= {"compaction", "members"}
    for o in sent:
        check_output(o)  # the schemas take generation and sig
        assert o.value["generation"] == "g-2"
        assert verify_directive(o.value, [public_key_of(NEW)]) is None, "signed with the first key"
        assert verify_directive(o.value, [public_key_of(OLD)]) == "bad_signature"
        assert verify_directive({**o.value, "safe_ts": 10**15}, [public_key_of(NEW)]) == "bad_signature"


def test_signing_is_deterministic_so_replay_signs_what_the_job_signs() -> None:
    value = {"v": 1, "type": "compaction", "cluster": "c1", "seq": 7, "safe_ts": 42, "basis": {"n2": 1, "n1": 2},
             "label": "né"}
    assert sign_directive(value, NEW) == sign_directive(dict(reversed(value.items())), NEW)
    assert directive_canonical(value) == json.dumps(value, sort_keys=True, separators=(",", ":"),
                                                    ensure_ascii=False).encode()
    assert verify_directive(value, [public_key_of(NEW)]) == "unsigned"


def test_the_security_pages_key_pair_signs_what_nodes_verify(capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(block("docs/security.md", ".venv/bin/safepoint directive-key").text)
    assert argv == [".venv/bin/safepoint", "directive-key"]
    assert cli(argv[1:]) == 0
    made = tomllib.loads(capsys.readouterr().out)
    private, public = made["directive_keys"], made["directive_key"]
    assert public == public_key_of(private) and private != public
    value = {"v": 1, "type": "compaction", "cluster": "c1", "seq": 1, "safe_ts": 5}
    assert verify_directive({**value, "sig": sign_directive(value, private)}, [public]) is None


def test_a_policy_refuses_a_key_that_is_not_one() -> None:
    with pytest.raises(ValueError, match="64 hex digits"):
        Policy(directive_keys="secret-word")


@dataclass
class Msg:
    """A record of the directives topic, as a listener reads it."""

    obj: dict[str, Any]

    def error(self) -> None:
        return None

    def value(self) -> bytes:
        return json.dumps(self.obj).encode()

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 0


def compaction(seq: int, safe_ts: int, generation: str | None = "g-1", key: str | None = OLD) -> dict[str, Any]:
    value: dict[str, Any] = {"v": 1, "type": "compaction", "cluster": "c1", "seq": seq, "safe_ts": safe_ts,
                             "catalog_floor": None, "cluster_wall_ms": T0, "blocker": None, "basis": {}}
    if generation is not None:
        value["generation"] = generation
    if key is not None:
        value["sig"] = sign_directive(value, key)
    return value


def listener(key: str | list[str] | None) -> DirectiveListener:
    lst = DirectiveListener("127.0.0.1:1", "c1", directive_key=key)  # no broker: records are handed to it
    lst._caught_up = True
    return lst


def test_a_listener_with_keys_acts_on_no_unsigned_forged_or_rotated_out_directive() -> None:
    lst = listener(public_key_of(OLD))
    assert lst._handle(Msg(compaction(1, 100))).safe_ts == 100  # type: ignore[union-attr]
    assert lst._handle(Msg(compaction(2, 10**15, key=None))) is None, "unsigned"
    assert lst._handle(Msg(compaction(3, 10**15, key=ROGUE))) is None, "signed by another key"
    forged = compaction(4, 200)
    forged["safe_ts"] = 10**15  # changed after signing
    assert lst._handle(Msg(forged)) is None
    stats = lst.stats()
    assert (stats.unsigned, stats.bad_signatures, lst.safe_ts, lst.seq) == (1, 2, 100, 1), "the newest valid one stands"
    # a rotation: both keys for a while, then the old one out
    both = listener(f"{public_key_of(NEW)},{public_key_of(OLD)}")
    assert both._handle(Msg(compaction(5, 300, key=OLD))) is not None
    assert both._handle(Msg(compaction(6, 400, key=NEW))) is not None
    rotated = listener([public_key_of(NEW)])
    assert rotated._handle(Msg(compaction(7, 500, key=OLD))) is None, "the key rotated out signs nothing any more"
    assert rotated._handle(Msg(compaction(8, 600, key=NEW))).safe_ts == 600  # type: ignore[union-attr]
    # without a key, every directive is taken (the gap an ACL must close)
    open_ = listener(None)
    assert open_._handle(Msg(compaction(1, 10**15, key=None))) is not None


def test_a_listener_takes_a_new_generation_from_its_start_unless_it_goes_back() -> None:
    lst = listener(public_key_of(OLD))
    assert lst._handle(Msg(compaction(40, 1_000))) is not None
    assert lst._handle(Msg(compaction(1, 900, generation="g-2"))) is None, "below the node's safe point: held back"
    assert lst._handle(Msg(compaction(2, 1_000, generation="g-2"))).seq == 2  # type: ignore[union-attr]
    assert lst._handle(Msg(compaction(3, 1_100, generation="g-2"))).seq == 3  # type: ignore[union-attr]
    assert lst._handle(Msg(compaction(41, 5_000))) is not None, "the old generation's own, signed: a generation too"
    stats = lst.stats()
    assert (stats.held_back, stats.generations) == (1, 2) and lst.safe_ts == 5_000
    # a new generation must be signed like any directive
    assert lst._handle(Msg(compaction(1, 10**15, generation="g-3", key=ROGUE))) is None


def test_per_node_directives_of_a_new_generation_start_their_seq_again() -> None:
    lst = listener(None)
    lst.node = "n1"
    got: list[int] = []
    lst._on_expire = lambda e: got.append(e.seq)

    def expire(seq: int, generation: str) -> dict[str, Any]:
        return {"v": 1, "type": "expire", "cluster": "c1", "node": "n1", "reader_id": f"r{seq}", "reason": "pressure",
                "mode": "graceful", "seq": seq, "generation": generation}

    for value in (expire(7, "g-1"), expire(7, "g-1"), expire(1, "g-2"), expire(2, "g-2")):
        lst._handle(Msg(value))
    assert got == [7, 1, 2]


def test_a_key_that_is_not_one_is_said_at_once() -> None:
    with pytest.raises(ConfigError, match="64 hex digits"):
        listener("not-a-key")


def test_the_etcd_agents_compactor_takes_a_new_generation_never_below_what_is_compacted() -> None:
    c = Compactor(1.0, seq=57, generation="g-1", compacted=5_000)
    assert not c.take(3, 4_000, "g-2"), "below the store's compacted revision"
    assert c.take(4, 6_000, "g-2") and (c.seq, c.generation, c.target) == (4, "g-2", 6_000)
    assert not c.take(4, 7_000, "g-2") and c.take(5, 7_000, "g-2")
    assert c.stats.stale_directives == 2
    upgraded = Compactor(1.0, seq=9, compacted=100)  # a state file of a job that gave no generation
    assert upgraded.take(10, 200, "g-1") and upgraded.generation == "g-1"
    assert not upgraded.take(1, 10**9, None), "a directive without a generation is older than one with it"


def test_a_directive_without_a_generation_never_supersedes_one_with_it() -> None:
    lst = listener(None)
    lst._caught_up = False
    for value in (compaction(40, 1_000, key=None), compaction(1, 10**9, generation=None, key=None)):
        lst._handle(Msg(value))
    assert lst._on_eof(0).seq == 40  # type: ignore[union-attr]
    assert lst._handle(Msg(compaction(2, 10**9, generation=None, key=None))) is None
    assert lst._handle(Msg(compaction(41, 1_100, key=None))).safe_ts == 1_100  # type: ignore[union-attr]

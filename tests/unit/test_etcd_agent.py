"""The etcd agent's rules without etcd or Kafka (``connectors/etcd_agent.py``'s ``Compactor``), and the
gateway's reading of a member's command line. The agent against a real etcd, the broker and the
job: ``tests/integration/test_etcd_e2e.py``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from safepoint.connectors.etcd_agent import Compactor, Observed
from safepoint.connectors.etcd_gateway import MemberStatus, _flags, parse_endpoints
from safepoint.connectors.etcd_holds import prefix_end


def test_it_compacts_at_the_newest_directive_never_above_it_nor_twice_within_the_interval() -> None:
    c = Compactor(interval_s=5.0)
    assert c.due(0.0, 1_000) is None, "no directive yet"
    assert c.take(3, 400)
    assert c.due(0.0, 1_000) == 400
    c.done(400, 0.0)
    assert c.take(4, 450)
    assert c.due(4.9, 1_000) is None, "within the interval"
    assert c.due(5.0, 1_000) == 450
    assert not c.take(4, 900) and not c.take(2, 900), "a repeated or an older directive does nothing"
    assert c.target == 450 and c.stats.stale_directives == 2
    assert c.take(5, 2_000)
    assert c.due(10.0, 1_200) == 1_200, "never above the store's current revision"


def test_never_at_or_below_what_is_compacted_and_foreign_compactions_are_counted() -> None:
    c = Compactor(interval_s=0.0)
    assert not c.seen(300), "what was compacted before the agent started is nobody's fault"
    c.take(1, 250)
    assert c.due(1.0, 1_000) is None, "at or below the compacted revision: nothing to do"
    c.take(2, 300)
    assert c.due(1.0, 1_000) is None
    c.take(3, 350)
    assert c.due(1.0, 1_000) == 350
    c.done(350, 1.0)
    assert not c.seen(350)
    assert c.seen(500) and c.stats.foreign_compactions == 1 and c.compacted == 500
    c.take(4, 450)
    assert c.due(9.0, 1_000) is None


@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 2_000), st.integers(0, 2_000), st.booleans()), max_size=60))
def test_no_compaction_passes_the_newest_directive_taken_or_goes_back(steps: list[tuple[int, int, int, bool]]) -> None:
    c = Compactor(interval_s=1.0)
    now = 0.0
    newest: tuple[int, int] | None = None
    for seq, safe_ts, current, outside in steps:
        now += 0.5
        if c.take(seq, safe_ts):
            newest = (seq, safe_ts)
        if outside:
            c.seen(max(0, safe_ts - 100))
        rev = c.due(now, current)
        if rev is not None:
            assert newest is not None and rev <= newest[1] and rev <= current and rev > c.compacted
            c.done(rev, now)


def test_figures_of_the_members() -> None:
    m = [MemberStatus("http://a", "1", "1", 10, 4_096, 1_024, 5), MemberStatus("http://b", "2", "1", 10, 8_192, 6_144, 5)]
    assert Observed(10, 7, m).figures() == {"pinned_bytes": 6_144, "debt_bytes": 3_072, "compacted_ts": 7}
    assert m[0].is_leader and not m[1].is_leader


def test_a_members_command_line_and_endpoints() -> None:
    assert _flags(["--auto-compaction-retention=1h", "--name", "m0", "--force-new-cluster"]) == {
        "auto-compaction-retention": "1h", "name": "m0", "force-new-cluster": "true"}
    assert parse_endpoints("http://a:2379/, http://b:2379") == ["http://a:2379", "http://b:2379"]
    with pytest.raises(ValueError, match="not an http"):
        parse_endpoints("a:2379")
    with pytest.raises(ValueError, match="no etcd endpoint"):
        parse_endpoints(" , ")
    assert prefix_end(b"/w/") == b"/w0" and prefix_end(b"a\xff") == b"b" and prefix_end(b"\xff") == b"\0"

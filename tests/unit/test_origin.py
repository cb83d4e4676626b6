"""Control events apart (``core/origin.py``): only the control topic steers; a file mixes both."""

from __future__ import annotations

import json
from typing import Any

from safepoint.core import Engine, Output, Policy, Position
from safepoint.core.gaps import Gap
from safepoint.core.origin import CONTROL, EVENTS, control_partition, is_control, kafka_partition

from core_helpers import NodeClient, alerts, check_output, cluster_event, directives

T0 = 1_767_225_600_000
ORIGINS = {"ev": EVENTS, "ctl": CONTROL}


class Fed:
    """An engine reading the events topic ``ev`` and the control topic ``ctl`` as the job does."""

    def __init__(self, origins: dict[str, str] | None = ORIGINS, **policy: Any) -> None:
        self.engine = Engine(Policy(node_lease_ms=10_000, **policy), record=True, origins=origins)
        self.outputs: list[Output] = []
        self.offsets: dict[str, int] = {}

    def send(self, topic: str, *events: dict[str, Any], key: str = "c1") -> list[Output]:
        out: list[Output] = []
        for ev in events:
            p = 0 if key == "c1" else 1  # the cluster's key on partition 0, the nodes' on 1
            off = self.offsets[f"{topic}{p}"] = self.offsets.get(f"{topic}{p}", -1) + 1
            out += self.engine.process(json.dumps(ev), Position(topic, p, off, key))
        for o in out:
            check_output(o)
        self.outputs += out
        return out

    def safe(self) -> int | None:
        ds = directives(self.outputs)
        return ds[-1]["safe_ts"] if ds else None

    def label(self) -> str:
        assert self.engine.outcomes is not None
        return self.engine.outcomes[-1][2]


def hold(holder: str, ts: int, wall: int, action: str = "a1") -> dict[str, Any]:
    return {"v": 1, "type": "service_hold", "cluster": "c1", "holder": holder, "ts": ts, "ttl_ms": 600_000,
            "wall_ms": wall, "action_id": action}


def started(fed: Fed) -> tuple[NodeClient, NodeClient]:
    n1, n2 = NodeClient("n1", "c1"), NodeClient("n2", "c1")
    fed.send("ev", cluster_event("topology", 1, T0, "c1", nodes={"n1": [], "n2": []}))
    fed.send("ev", n1.hb(T0, 1_000), n2.hb(T0, 1_000), key="n")
    return n1, n2


def test_routed_partitions_of_the_two_topics_never_meet() -> None:
    for p in range(5):
        assert is_control(control_partition(p)) and kafka_partition(control_partition(p)) == p
        assert not is_control(p) and kafka_partition(p) == p
    assert not is_control(-1) and not is_control(None), "-1 is a gap record's"


def test_a_control_event_on_the_events_topic_is_dead_lettered_alerted_and_changes_nothing() -> None:
    fed = Fed()
    n1, n2 = started(fed)
    fed.send("ctl", hold("backup", 1_500, T0 + 10))
    out = fed.send("ev", {"v": 1, "type": "service_release", "cluster": "c1", "holder": "backup", "wall_ms": T0 + 20,
                          "action_id": "forged"})
    assert fed.label() == "deadlettered:misrouted"
    (letter,) = [o for o in out if o.channel == "deadletter"]
    assert letter.value["topic"] == "ev" and letter.value["key"] == "c1" and "service_release" in letter.value["value"]
    (alert,) = [o.value for o in out if o.channel == "alerts"]
    assert alert["kind"] == "event_misrouted" and alert["severity"] == "critical"
    assert "events topic ev" in alert["detail"] and "'c1'" in alert["detail"]
    action = fed.engine.clusters["c1"].control.action("forged")
    assert action is not None and (action["outcome"], action["reason"]) == ("refused", "misrouted")
    fed.send("ev", {"v": 1, "type": "pause", "cluster": "c1", "reason": "forged", "wall_ms": T0 + 30})
    fed.send("ev", n1.hb(T0 + 5_000, 9_000), n2.hb(T0 + 5_000, 9_000), key="n")
    assert fed.safe() == 1_500, "the hold still protects its timestamp, and the safe point is not paused"
    assert fed.engine.clusters["c1"].control.paused is None
    fed.send("ctl", {"v": 1, "type": "service_release", "cluster": "c1", "holder": "backup", "wall_ms": T0 + 6_000})
    assert alerts(fed.outputs, "event_misrouted", "cleared"), "the control topic speaks again: the alert clears"
    fed.send("ev", n1.hb(T0 + 7_000, 9_500), n2.hb(T0 + 7_000, 9_500), key="n")
    assert fed.safe() == 9_500


def test_old_publishers_work_only_with_control_on_events_topic() -> None:
    fed = Fed(control_on_events_topic=True)
    n1, n2 = started(fed)
    fed.send("ev", hold("backup", 1_500, T0 + 10))
    assert fed.label() == "applied"
    fed.send("ev", n1.hb(T0 + 5_000, 9_000), n2.hb(T0 + 5_000, 9_000), key="n")
    assert fed.safe() == 1_500


def test_a_node_event_on_the_control_topic_is_refused_whatever_the_setting() -> None:
    fed = Fed(control_on_events_topic=True)
    n1, _n2 = started(fed)
    out = fed.send("ctl", n1.open("r", 1_100, T0 + 10), key="n1")
    assert fed.label() == "deadlettered:misrouted"
    assert any(o.channel == "deadletter" and o.value["topic"] == "ctl" for o in out)
    assert fed.engine.nodes[("c1", "n1")].open_holds() == [], "the reader was not opened"


def test_a_file_mixes_both_kinds() -> None:
    fed = Fed(origins=None)
    n1, n2 = started(fed)
    fed.send("ev", hold("backup", 1_500, T0 + 10))
    assert fed.label() == "applied"


def test_a_gap_freezes_for_lost_holds_only_on_the_topic_they_come_from() -> None:
    # holds come from the control topic: a gap of the events topic where the cluster's key lives
    # waits for an acknowledgement (a topology may be lost) but does not freeze for a lost hold
    fed = Fed(max_service_hold_ttl_ms=60_000)
    n1, n2 = started(fed)
    fed.send("ctl", hold("backup", 1_500, T0 + 10))
    fed.send("ctl", {"v": 1, "type": "service_release", "cluster": "c1", "holder": "backup", "wall_ms": T0 + 20})
    fed.outputs += fed.engine.gap(Gap(1, "ev", 0, 3, 5, "lost", T0 + 30))
    fed.send("ev", n1.hb(T0 + 1_000, 5_000), n2.hb(T0 + 1_000, 5_000), key="n")
    assert fed.safe() == 5_000
    assert fed.engine.clusters["c1"].gaps.status()[0]["holds_until"] is None
    # a gap of the control topic freezes for max_service_hold_ttl_ms, asks no node for a snapshot
    out = fed.engine.gap(Gap(2, "ctl", 0, 2, 4, "lost", T0 + 1_100, control=True))
    fed.outputs += out
    (raised,) = [o.value for o in out if o.value.get("kind") == "events_lost"]
    assert "control events" in raised["detail"] and "snapshot" not in raised["detail"]
    fed.send("ev", n1.hb(T0 + 2_000, 7_000), n2.hb(T0 + 2_000, 7_000), key="n")
    assert fed.safe() == 5_000, "a hold may have been set in the lost control events"
    assert not [o for o in fed.outputs if o.value.get("type") == "snapshot_request"]
    fed.send("ctl", {"v": 1, "type": "gap_ack", "cluster": "c1", "gap": 2, "wall_ms": T0 + 2_100})
    fed.send("ev", n1.hb(T0 + 3_000, 8_000), n2.hb(T0 + 3_000, 8_000), key="n")
    assert fed.safe() == 8_000

"""Pull the levers from a shell: ``safepoint hold set|release|list``, ``safepoint pause|resume`` and
``safepoint ack-gap`` (an operator's acknowledgement of a gap in the log, ``core/gaps.py``).

Every action is a control event with an ``action_id`` of its own, published to the control topic
(``control_topic``; key: the cluster id) through ``connectors/actions.py``'s ``ControlPublisher``, so it is audited,
replayed by ``safepoint replay`` and applied by the job like any other event; nothing changes
behind the log's back. Then the command waits (``--wait-timeout``, default 60 s; ``--no-wait``
does not) for the job to report the action's outcome in the cluster's status: exit 0 when it was
applied (or ignored, with the reason: a resume of a cluster that is not paused), 1 when it was
refused or its hold already expired, 3 when no outcome came in time. ``hold list`` reads the
cluster's service holds from the status topic. An unreachable broker fails within a few seconds
with one line and exit code 2.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from safepoint.connectors.actions import LOST, ActionOutcomes, ControlPublisher
from safepoint.connectors.kafka.topics import check_reachable, quiet
from safepoint.core.signing import owner_digest
from safepoint.errors import SafepointError
from safepoint.settings import Settings

__all__ = ["run_args", "add_parsers", "CONTROL_REACH_TIMEOUT_S", "EXIT_REFUSED", "EXIT_NO_OUTCOME", "act",
           "parse_duration_ms", "publisher", "service_holds_of"]

CONTROL_REACH_TIMEOUT_S = 5.0
EXIT_REFUSED = 1
EXIT_NO_OUTCOME = 3
_UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``1h``, ``30m``, ``90s``, ``500ms``, ``2d`` or a number of milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", text)
    if not m:
        msg = f"not a duration: {text!r} (use e.g. 1h, 30m, 90s, 500ms or milliseconds)"
        raise SafepointError(msg)
    value = int(m.group(1)) * _UNITS[m.group(2) or "ms"]
    if value < 1:
        msg = f"a duration must be at least 1 ms, got {text!r}"
        raise SafepointError(msg)
    return value


def publisher(settings: Settings) -> ControlPublisher:
    """The control publisher of ``settings``' broker, after checking that the broker answers."""
    conf = settings.librdkafka()
    check_reachable(conf, CONTROL_REACH_TIMEOUT_S)
    return ControlPublisher(quiet(conf), settings.control_topic, max_message_bytes=settings.max_message_bytes,
                            signer=signer_of(settings))


def signer_of(settings: Settings) -> Callable[[str], str | None]:
    """The key that signs a cluster's control events: the first of its ``control_keys`` (its
    ``[clusters.NAME]`` table's, else the top level's), None when it has none."""
    policies = settings.policies()

    def key(cluster: str) -> str | None:
        keys = policies.of(cluster).signing_keys
        return keys[0] if keys else None

    return key


def act(settings: Settings, event: dict[str, Any], wait_s: float | None) -> int:
    """Publish ``event`` and (``wait_s``) wait for its outcome; prints both; returns the exit code."""
    what, cluster = event["type"], event["cluster"]
    pub = publisher(settings)
    outcomes = ActionOutcomes(quiet(settings.librdkafka()), settings.status_topic, cluster) if wait_s else None
    try:
        aid = pub.publish(event)
        print(f"safepoint: {what} published to {settings.control_topic} for cluster {cluster} (action {aid})", flush=True)
        if outcomes is None:
            return 0
        if not outcomes.available:
            print(f"safepoint: cannot learn the outcome ({outcomes.why}); see `hold list` or the status API",
                  file=sys.stderr)
            return 0
        outcome = outcomes.wait(aid, wait_s or 0.0)
    finally:
        pub.close()
        if outcomes is not None:
            outcomes.close()
    if outcome is None:
        print(f"safepoint: no outcome of action {aid} from the job within {wait_s:.0f} s (is the job running, with "
              f"its status on {settings.status_topic}?)", file=sys.stderr)
        return EXIT_NO_OUTCOME
    reason = f" ({outcome['reason']})" if outcome.get("reason") else ""
    print(f"safepoint: {what} {outcome['outcome']}{reason}: {outcome['detail']}", flush=True)
    return EXIT_REFUSED if outcome["outcome"] in LOST else 0


def service_holds_of(settings: Settings, cluster: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The cluster's status read from the status topic up to its end (None: the job has not
    published one)."""
    from safepoint.connectors.kafka.follow import read_to_end
    from safepoint.ops.status_store import StatusStore

    conf = settings.librdkafka()
    check_reachable(conf, CONTROL_REACH_TIMEOUT_S)
    store = StatusStore(history=1)
    for msg in read_to_end(quiet(conf), settings.status_topic, timeout_s, client_id="safepoint-hold-list"):
        store.apply_raw(msg.key(), msg.value())
    return store.status(cluster)


def add_parsers(sub: Any, bootstrap_flag: Any) -> None:
    """``hold set|release|list``, ``pause`` and ``resume`` (``bootstrap_flag(p)`` adds the Kafka flags)."""
    p = sub.add_parser("hold", help="service holds: set or renew, release, list (a backup's or CDC's pin on history)")
    actions = p.add_subparsers(dest="hold_action", required=True)
    s = actions.add_parser("set", help="set or renew the named hold of CLUSTER at --ts for --ttl")
    s.add_argument("cluster")
    s.add_argument("holder")
    s.add_argument("--ts", type=int, required=True, help="the MVCC timestamp the safe point must not pass")
    s.add_argument("--ttl", required=True, help="how long without a renewal it lasts: 1h, 30m, 90s, 500ms")
    s.add_argument("--label", default=None, help="what it is for, shown in the status")
    r = actions.add_parser("release", help="release the named hold")
    r.add_argument("cluster")
    r.add_argument("holder")
    for a in (s, r):
        a.add_argument("--owner-token", default=None,
                       help="the hold's owner token: a set with it makes the hold its owner's (renewed, moved and "
                            "released only with it); a release proves it")
        a.add_argument("--force", action="store_true",
                       help="an operator's override: set or release a hold of another owner (recorded as forced)")
    lst = actions.add_parser("list", help="the cluster's service holds, from the status topic")
    lst.add_argument("cluster")
    lst.add_argument("--json", action="store_true", help="print them as JSON")
    for q in (s, r, lst):
        bootstrap_flag(q)
    p = sub.add_parser("pause", help="pause CLUSTER: no directive advances, no forced expiry, until resume")
    p.add_argument("cluster")
    p.add_argument("--reason", required=True, help="why (an incident, a restore): shown in the status and the alert")
    bootstrap_flag(p)
    q = sub.add_parser("resume", help="resume a paused CLUSTER")
    q.add_argument("cluster")
    bootstrap_flag(q)
    g = sub.add_parser("ack-gap", help="acknowledge a gap of the events or control topic (events lost before the job read them) "
                                       "once checked: control events that may have been lost in it stop holding "
                                       "the safe point")
    g.add_argument("cluster")
    g.add_argument("--gap", type=int, default=None, help="the gap's id (the status lists the open gaps); "
                                                         "default: every open gap of the cluster")
    bootstrap_flag(g)
    for action in (s, r, p, q, g):
        action.add_argument("--wait-timeout", type=float, default=60.0,
                            help="seconds to wait for the job's outcome (default 60; exit 3 when none came)")
        action.add_argument("--no-wait", action="store_true", help="publish and exit without waiting for the outcome")


def run_args(args: Any, settings: Settings) -> int:
    return run(args.command, args, settings)


def run(command: str, args: Any, settings: Settings) -> int:
    import json

    wait_s = None if getattr(args, "no_wait", False) else getattr(args, "wait_timeout", None)
    if command in ("pause", "resume"):
        return act(settings, ControlPublisher.event(command, args.cluster, reason=getattr(args, "reason", None)), wait_s)
    if command == "ack-gap":
        return act(settings, ControlPublisher.event("gap_ack", args.cluster, gap=args.gap), wait_s)
    if args.hold_action == "set":
        event = ControlPublisher.event("service_hold", args.cluster, holder=args.holder, ts=args.ts,
                                       ttl_ms=parse_duration_ms(args.ttl), label=args.label,
                                       owner=owner_digest(args.owner_token) if args.owner_token else None,
                                       force=True if args.force else None)
        return act(settings, event, wait_s)
    if args.hold_action == "release":
        return act(settings, ControlPublisher.event("service_release", args.cluster, holder=args.holder,
                                                    owner_token=args.owner_token, force=True if args.force else None),
                   wait_s)
    status = service_holds_of(settings, args.cluster)
    if status is None:
        msg = f"no status of cluster {args.cluster!r} in {settings.status_topic} (is the job running with the status on?)"
        raise SafepointError(msg)
    holds = status.get("service_holds", [])
    if args.json:
        print(json.dumps({"cluster": args.cluster, "safe_ts": status.get("safe_ts"), "service_holds": holds,
                          "refused_or_ignored": status.get("control_ignored", {})}, indent=1))
        return 0
    print(f"cluster {args.cluster}: safe_ts {status.get('safe_ts')}, {len(holds)} service hold(s)")
    for h in holds:
        print(f"  {h['holder']}: ts {h['ts']}, ttl {h['ttl_ms']} ms, expires after cluster time {h['expires_after_ms']}"
              + (f", label {h['label']}" if h.get("label") else ""))
    return 0

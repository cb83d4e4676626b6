"""``safepoint client-driver``: the node client driven by JSON lines, one operation each, for conformance.

The same protocol runs the Go and the Java clients (``clients/go/safepoint-driver``,
``clients/java/safepoint-driver``), so that the shared test vectors (``schemas/vectors/``) can feed
the three the same operations and compare what each published. A driver is one node: a reporter
(its ``--incarnation``, heartbeats every ``--heartbeat-ms``, 0: only when asked; ``--retention`` for
lazy registration; ``--node-key`` to sign its events) and a directive listener (``--directive-key``
to verify them) that answers snapshot requests and hands expiries to the handles.

Operations (stdin, a JSON object a line), each answered by one line on stdout with its ``op``, its
``ref`` where it has one, and ``"ok": true`` or ``"error"`` (``refused``: below the safe point;
``expired``: the job expired it; ``unknown``: no such open reader or transaction; ``invalid``: a
malformed operation, with ``detail``):

- ``{"op":"clock","mvcc_now":300}``: the node's MVCC time from now on (what readers and transactions
  opened without ``ts`` read at, and heartbeats carry);
- ``{"op":"reader","ref":"a","ts":100,"label":"x","groups":["g"],"namespace":"t0"}``: open a reader
  whose id is ``ref`` (every field but ``op`` and ``ref`` optional); ``{"op":"close","ref":"a"}``;
- ``{"op":"tx","ref":"t","ts":200}``: begin a transaction (the same optional fields);
  ``{"op":"prepare","ref":"t","coordinator":"n2","participants":["n1","n2"]}``;
  ``{"op":"end","ref":"t","outcome":"commit"}``;
- ``{"op":"check","ref":"a"}``: the handle's operation boundary (``expired`` once the job expired it);
- ``{"op":"heartbeat"}``: publish one now, with any of the figures ``pinned_bytes``, ``debt_bytes``,
  ``groups``, ``history_above`` given (they stand for later heartbeats too); ``{"op":"snapshot"}``;
- ``{"op":"hold","ref":"backup","ts":400,"ttl_ms":3000,"label":"x"}``: a service hold named ``ref``
  (``label`` optional), set once the job accepted it (``"error": "refused"`` with ``detail`` when it
  refused it; without a job in ``--status-topic`` it is set once the broker has it), renewed until
  ``{"op":"release","ref":"backup"}``;
- ``{"op":"publish","ref":"b","readers":100000}``: a benchmark's load: open and close that many
  readers (ids ``b-0``, ``b-1``...) at the clock as fast as the client goes, then flush; the reply
  gives the events published and the time taken (``{"op":"publish","ref":"b","events":200000,"ms":1530}``);
- ``{"op":"sleep","ms":100}``;
- ``{"op":"wait","safe_ts_at_least":250,"timeout_ms":30000}``: the first directive with that
  ``safe_ts`` (``{"op":"wait","directive":{...}}``), or ``{"op":"wait","timeout":true}``;
  ``{"op":"wait","expired":"a"}`` until the job expired that handle (``{"op":"wait","expired":"a"}``);
  ``{"op":"wait","snapshot_requests":1}`` until the listener answered that many snapshot requests.

An expiry that reaches a handle prints ``{"op":"expired","ref":...,"mode":...}`` when it arrives. At
the end of the input the driver closes the readers still open, aborts the transactions still open,
releases its service holds, flushes and exits 0.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from safepoint.connectors.directive_models import ExpireDirective
from safepoint.connectors.handles import Handle, Reader, Transaction
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import SNAPSHOT_PART_BYTES, Reporter
from safepoint.connectors.service_hold import HoldRefused, ServiceHold
from safepoint.errors import ReaderExpired, ReaderRefused, SafepointError

__all__ = ["DRIVERS", "Driver", "FIGURES", "run_driver"]

_CLIENTS = Path(__file__).resolve().parents[3] / "clients"
DRIVERS = {"python": [sys.executable, "-m", "safepoint.cli", "client-driver"],
           "go": [str(_CLIENTS / "go" / "safepoint-driver")],
           "java": [str(_CLIENTS / "java" / "safepoint-driver")]}
"""The driver of each client, a command (in a checkout: the Go and Java ones are scripts that build
their client on first use; setup builds both). Each command's process is the driver's own (the
scripts exec it), so its CPU and memory are the client's."""

FIGURES = ("pinned_bytes", "debt_bytes", "groups", "history_above")
"""The heartbeat's optional figures a ``heartbeat`` operation may give."""


class Driver:
    """One node driven by operations (see the module's text); ``out`` takes each reply line."""

    def __init__(self, reporter_of: Callable[[Callable[[], int], Callable[[], dict[str, Any]],
                                              Callable[[Handle, ExpireDirective], None]], Reporter],
                 listener_of: Callable[[Reporter, Callable[[Any], None]], DirectiveListener], out: IO[str],
                 hold_of: Callable[[str, int, int, str | None], ServiceHold] | None = None) -> None:
        self.mvcc_now = 0
        self.figures: dict[str, Any] = {}
        self.expired: set[str] = set()
        self.out = out
        self._lock = threading.Lock()
        self.handles: dict[str, Reader | Transaction] = {}
        self.reporter = reporter_of(lambda: self.mvcc_now, lambda: dict(self.figures), self._expired)
        self.directives: list[dict[str, Any]] = []
        self._seen = threading.Condition()
        self.listener = listener_of(self.reporter, self._directive)
        self.hold_of = hold_of
        self.holds: dict[str, ServiceHold] = {}

    def say(self, reply: dict[str, Any]) -> None:
        with self._lock:
            self.out.write(json.dumps(reply, separators=(",", ":"), ensure_ascii=False) + "\n")
            self.out.flush()

    def _expired(self, handle: Handle, directive: ExpireDirective) -> None:
        ref = directive.reader_id or directive.tx_id
        self.say({"op": "expired", "ref": ref, "mode": directive.mode})
        with self._seen:
            self.expired.add(str(ref))
            self._seen.notify_all()

    def _directive(self, directive: Any) -> None:
        with self._seen:
            self.directives.append(directive.raw)
            self._seen.notify_all()

    def run(self, lines: Iterable[str]) -> None:
        self.listener.start()
        try:
            for line in lines:
                if line.strip():
                    self.say(self.step(line))
        finally:
            self.finish()

    def step(self, line: str) -> dict[str, Any]:
        try:
            op = json.loads(line)
            name = op["op"]
        except (ValueError, KeyError, TypeError) as exc:
            return {"op": None, "error": "invalid", "detail": f"not an operation: {exc}"}
        ref = op.get("ref")
        reply: dict[str, Any] = {"op": name, **({"ref": ref} if ref is not None else {})}
        try:
            extra = self.apply(name, op)
        except ReaderRefused:
            return {**reply, "error": "refused"}
        except ReaderExpired:
            return {**reply, "error": "expired"}
        except HoldRefused as exc:
            return {**reply, "error": "refused", "detail": str(exc)}
        except KeyError as exc:
            return {**reply, "error": "unknown", "detail": f"no open reader or transaction {exc}"}
        except (SafepointError, ValueError, TypeError) as exc:
            return {**reply, "error": "invalid", "detail": str(exc)}
        return {**reply, **(extra or {"ok": True})}

    def apply(self, name: str, op: dict[str, Any]) -> dict[str, Any] | None:  # noqa: C901 - one branch per operation
        label, groups, namespace = op.get("label"), op.get("groups"), op.get("namespace")
        if name == "clock":
            self.mvcc_now = int(op["mvcc_now"])
        elif name == "reader":
            self.handles[op["ref"]] = self.reporter.reader(op.get("ts"), reader_id=op["ref"], label=label, groups=groups,
                                                           namespace=namespace).open()
        elif name == "tx":
            self.handles[op["ref"]] = self.reporter.transaction(op.get("ts"), tx_id=op["ref"], label=label, groups=groups,
                                                                namespace=namespace).begin()
        elif name == "prepare":
            tx = self.handles[op["ref"]]
            if not isinstance(tx, Transaction):
                raise KeyError(op["ref"])
            tx.prepare(op["coordinator"], op.get("participants") or [])
        elif name == "end":
            tx = self.handles.pop(op["ref"])
            if not isinstance(tx, Transaction):
                raise KeyError(op["ref"])
            tx.end(op.get("outcome", "commit"))
        elif name == "close":
            reader = self.handles.pop(op["ref"])
            if not isinstance(reader, Reader):
                raise KeyError(op["ref"])
            reader.close()
        elif name == "check":
            self.handles[op["ref"]].check()
        elif name == "heartbeat":
            self.figures.update({k: op[k] for k in FIGURES if k in op})
            self.reporter.heartbeat()
        elif name == "snapshot":
            self.reporter.snapshot()
        elif name == "hold":
            if self.hold_of is None:
                msg = "this driver makes no service holds"
                raise ValueError(msg)
            hold = self.hold_of(op["ref"], int(op["ts"]), int(op["ttl_ms"]), op.get("label"))
            hold.__enter__()
            self.holds[op["ref"]] = hold
        elif name == "release":
            self.holds.pop(op["ref"]).close()
        elif name == "publish":
            return self.publish(str(op["ref"]), int(op["readers"]))
        elif name == "sleep":
            time.sleep(int(op["ms"]) / 1000)
        elif name == "wait":
            return self.wait(op, int(op.get("timeout_ms", 30_000)))
        else:
            msg = f"unknown operation {name!r}"
            raise ValueError(msg)
        return None

    def publish(self, ref: str, readers: int) -> dict[str, Any]:
        """Open and close ``readers`` readers as fast as the client goes, then flush: events and ms."""
        sent = self.reporter.stats().sent
        start = time.perf_counter()
        for i in range(readers):
            self.reporter.reader(reader_id=f"{ref}-{i}").open().close()
        if self.reporter.flush(120.0):
            msg = "the events were not all delivered in 120 s"
            raise SafepointError(msg)
        return {"events": self.reporter.stats().sent - sent, "ms": round((time.perf_counter() - start) * 1000)}

    def wait(self, op: dict[str, Any], timeout_ms: int) -> dict[str, Any]:
        """Until the directive, the expiry or the snapshot requests ``op`` names came, or ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000
        with self._seen:
            while True:
                found = self._found(op)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"timeout": True}
                self._seen.wait(min(left, 0.1))  # snapshot requests are counted by the listener, unannounced

    def _found(self, op: dict[str, Any]) -> dict[str, Any] | None:
        if "expired" in op:
            return {"expired": op["expired"]} if op["expired"] in self.expired else None
        if "snapshot_requests" in op:
            answered = self.listener.stats().snapshot_requests
            return {"snapshot_requests": answered} if answered >= int(op["snapshot_requests"]) else None
        at_least = int(op["safe_ts_at_least"])
        return next(({"directive": d} for d in self.directives if d.get("safe_ts", -1) >= at_least), None)

    def finish(self) -> None:
        """Close the readers still open, abort the transactions, flush and stop."""
        for ref, handle in list(self.handles.items()):
            try:
                if isinstance(handle, Transaction):
                    handle.end("abort")
                else:
                    handle.close()
            except SafepointError:
                pass
            self.handles.pop(ref, None)
        for hold in self.holds.values():
            hold.close()
        self.listener.close()
        self.reporter.close()


def run_driver(bootstrap: str, cluster: str, node: str, incarnation: int, heartbeat_ms: int, retention: int | None,
               node_key: str | None, directive_key: str | None, events_topic: str, directives_topic: str,
               snapshot_part_bytes: int | None = None, lines: Iterable[str] | None = None, out: IO[str] | None = None,
               control_topic: str = "safepoint.control", status_topic: str = "safepoint.status") -> int:
    """``safepoint client-driver``: the operations of ``lines`` (stdin) through one node; 0 at their end."""

    def reporter_of(clock: Callable[[], int], figures: Callable[[], dict[str, Any]],
                    on_expire: Callable[[Handle, ExpireDirective], None]) -> Reporter:
        return Reporter(bootstrap, node, mvcc_clock=clock, cluster=cluster, incarnation=incarnation, topic=events_topic,
                        figures=figures,
                        heartbeat_interval_s=heartbeat_ms / 1000 if heartbeat_ms > 0 else None, retention=retention,
                        node_key=node_key, on_expire=on_expire,
                        snapshot_part_bytes=snapshot_part_bytes or SNAPSHOT_PART_BYTES)

    def listener_of(reporter: Reporter, on_directive: Callable[[Any], None]) -> DirectiveListener:
        return DirectiveListener(bootstrap, cluster, topic=directives_topic, reporter=reporter, directive_key=directive_key,
                                 on_directive=on_directive)

    def hold_of(holder: str, ts: int, ttl_ms: int, label: str | None) -> ServiceHold:
        return ServiceHold(bootstrap, cluster, holder, ts, ttl_ms, label=label, control_topic=control_topic,
                           status_topic=status_topic)

    Driver(reporter_of, listener_of, out or sys.stdout, hold_of).run(lines if lines is not None else sys.stdin)
    return 0

"""The capacity model's inputs, from one run's own figures, and its check against a measured point.

The model (docs/benchmark.md, "Capacity model"): a fleet of N clusters of M nodes, each node
opening r readers a second and sending a heartbeat every h seconds, sends
``E = N * M * (1/h + r * e)`` events a second, where ``e`` is the events a reader costs (2 when
every reader is published, the fleet phase's lazy figure with lazy registration). A micro-batch
runs two stages one after the other: the read stage (consume, parse, route, pack), spread over
every core, and the stateful operator, one task per shuffle partition with each cluster's
events in one task. With ``c`` the job's CPU per event besides the broker on one core
(``local[1]``) and ``s`` the operator's share of it per event (its tasks' time, Spark's
``allUpdatesTimeMs``), ``k`` cores run ``1e6 / ((c - s) / k + s / p)`` events a second, where
``p`` = min(k, clusters, shuffle partitions) operator tasks run side by side; one cluster's rate
is bound by ``1e6 / s`` whatever the cores (its round is serial). A fleet needs ``E * c / 1e6``
busy cores, as many Kafka partitions of the events topic and shuffle partitions as it has cores at
least, and each cluster's rate under its serial bound.
"""

from __future__ import annotations

import math
from typing import Any

from bench_common import fmt_rate
from bench_machine import saturation

# the fleet the report's example sizes: clusters, nodes each, readers/s a node, heartbeat s
EXAMPLE = (100, 50, 500.0, 1.0)
HEADROOM = 0.7  # share of a core the model plans to keep busy


def capacity_inputs(res: dict[str, Any]) -> dict[str, Any]:
    """The model's inputs from the run (those its phases measured), and the model's prediction of
    the best multi-core run's rate from ``local[1]``'s figures beside what was measured."""
    args = res.get("args") or {}
    out: dict[str, Any] = {"clusters": args.get("clusters", 1), "partitions": args.get("partitions"),
                           "shuffle_partitions": args.get("shuffle_partitions")}
    sat = saturation(res)
    runs = sat.get("runs") or {}
    tps = {t["master"]: t for t in res.get("spark_throughput", []) if t.get("status", True)}
    one = tps.get("local[1]")
    if runs.get("local[1]") and one:
        out["job_us_per_event_1"] = runs["local[1]"][2]
        out["per_core_events_per_s"] = 1e6 / runs["local[1]"][2]
        if one.get("operator_us_per_event"):
            out["serial_us_per_event"] = min(one["operator_us_per_event"], runs["local[1]"][2])
            out["cluster_limit_events_per_s"] = 1e6 / out["serial_us_per_event"]
    best = max((t for m, t in tps.items() if m != "local[1]"), key=lambda t: t.get("sustained_events_per_s") or 0,
               default=None)
    if best and runs.get(best["master"]):
        out["job_us_per_event"] = runs[best["master"]][2]
    raw = res.get("raw_consume")
    if raw:
        out["read_events_per_s"] = raw["events_per_s"]
    fleet = res.get("fleet")
    if fleet:
        out["events_per_reader"] = {m: fleet[m]["events_per_reader"] for m in ("eager", "lazy")}
    if best and "serial_us_per_event" in out and runs.get(best["master"]):
        k = sat["cores"] - runs[best["master"]][1]  # the cores the broker left in that run
        tasks = min(k, out["clusters"], out["shuffle_partitions"] or 1)
        c, s = out["job_us_per_event_1"], out["serial_us_per_event"]
        out["check"] = {"master": best["master"], "cores_left": k, "operator_tasks": tasks,
                        "predicted_events_per_s": 1e6 / ((c - s) / k + s / tasks),
                        "measured_events_per_s": best.get("sustained_events_per_s")}
    return out


def fleet_needs(inp: dict[str, Any], clusters: int, nodes: int, reader_rate: float, heartbeat_s: float,
                events_per_reader: float) -> dict[str, Any]:
    """What the model gives for one fleet, from the run's inputs."""
    per_node = 1 / heartbeat_s + reader_rate * events_per_reader
    events = clusters * nodes * per_node
    cores = events * inp.get("job_us_per_event", inp.get("job_us_per_event_1", 0)) / 1e6 / HEADROOM
    read = inp.get("read_events_per_s")
    partitions = max(math.ceil(cores), math.ceil(events / read) if read else 0)
    cluster_rate = nodes * per_node
    limit = inp.get("cluster_limit_events_per_s")
    return {"events_per_s": events, "cores": cores, "partitions": partitions, "cluster_events_per_s": cluster_rate,
            "cluster_share_of_limit": cluster_rate / limit if limit else None}


def capacity_lines(res: dict[str, Any]) -> list[str]:
    inp = capacity_inputs(res)
    if "job_us_per_event_1" not in inp:
        return []
    L = ["## Capacity model: its inputs from this run", ""]  # noqa: N806
    L.append(f"- the job's CPU per event besides the broker on one core (local[1]): {inp['job_us_per_event_1']:.1f} us "
             f"({fmt_rate(inp['per_core_events_per_s'])} ev/s per busy core)"
             + (f"; {inp['job_us_per_event']:.1f} us on the multi-core run" if "job_us_per_event" in inp else ""))
    if inp.get("serial_us_per_event"):
        L.append(f"- the stateful operator's share, serial within a cluster: {inp['serial_us_per_event']:.1f} us per event "
                 f"(its tasks' allUpdatesTimeMs on local[1]): at most {fmt_rate(inp['cluster_limit_events_per_s'])} ev/s "
                 "for one cluster, whatever the cores")
    if inp.get("read_events_per_s"):
        L.append(f"- one consumer's read of the events topic: {fmt_rate(inp['read_events_per_s'])} ev/s "
                 f"({inp['partitions']} partitions)")
    if inp.get("events_per_reader"):
        e = inp["events_per_reader"]
        L.append(f"- events per database reader: {e['eager']:.3f} published eagerly, {e['lazy']:.4f} with lazy registration")
    chk = inp.get("check")
    if chk and chk.get("measured_events_per_s"):
        L.append(f"- checked against {chk['master']} with {inp['clusters']} cluster(s): the model gives "
                 f"{fmt_rate(chk['predicted_events_per_s'])} ev/s ({chk['cores_left']:.2f} cores left by the broker, "
                 f"{chk['operator_tasks']:.2f} operator task(s) side by side), measured "
                 f"{fmt_rate(chk['measured_events_per_s'])} ev/s ({chk['measured_events_per_s'] / chk['predicted_events_per_s']:.2f}x)")
    if inp.get("events_per_reader"):
        n, m, r, h = EXAMPLE
        for mode in ("eager", "lazy"):
            f = fleet_needs(inp, n, m, r, h, inp["events_per_reader"][mode])
            share = (f"; each cluster {fmt_rate(f['cluster_events_per_s'])} ev/s, {f['cluster_share_of_limit']:.2f} of its serial "
                     "bound" if f["cluster_share_of_limit"] is not None else "")
            L.append(f"- example, {n} clusters of {m} nodes, {r:g} readers/s a node, a heartbeat every {h:g} s, {mode}: "
                     f"{fmt_rate(f['events_per_s'])} ev/s, {f['cores']:.1f} executor cores at {HEADROOM:.0%} busy, "
                     f"{f['partitions']} partitions at least{share}")
    L.append("")
    return L

"""Everything the core makes over a fixed set of logs, as one digest: ``tests/unit/test_compiled_core.py``
runs this module in two processes, the core compiled and as Python, and compares what they print.

The logs: the four examples under their own settings (``safepoint replay``'s outputs and its final
status) and generated logs of two clusters with restarts, groups, long readers, duplicates and junk
through the job's batch logic (``LocalJob``: outputs, status parts, accounting, the stored state)
and through ``replay`` in the job's order.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import sys
from pathlib import Path

from test_batch import messages, replay_in_job_order, run

from safepoint.core import CORE
from safepoint.core.codec import encode
from safepoint.core.policy import Policy
from safepoint.replay import final_status, replay_file
from safepoint.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def digest() -> dict[str, object]:
    h = hashlib.sha256()
    made = 0
    for example in sorted((ROOT / "examples").glob("*/events.jsonl")):
        policy = load_settings(config=example.parent / "safepoint.toml", environ={}).policy()
        out, dead = io.StringIO(), io.StringIO()
        engine = replay_file(str(example), out, policy, dead)
        for text in (out.getvalue(), dead.getvalue(), encode(final_status(engine))):
            h.update(text.encode() + b"\0")
            made += text.count("\n") + 1
    policy = Policy(retention=200_000, node_lease_ms=1_500, directive_interval_ms=100, stall_ms=3_000,
                    reader_age_warning_ms=1_500, reader_age_critical_ms=3_000, in_doubt_timeout_ms=1_000,
                    clock_skew_window_ms=1_000)
    for seed in (1, 2, 3, 4):
        msgs = messages(seed)
        splits = sorted(random.Random(seed).sample(range(1, len(msgs)), 12))
        got, job = run(msgs, splits, policy, accounting=True, buckets=4)
        expected, accounting, engine = replay_in_job_order(msgs, splits, policy)
        for part in (got, job.accounting, job.state_bytes(), expected, accounting, final_status(engine)):
            text = json.dumps(part, sort_keys=True)
            h.update(text.encode() + b"\0")
        made += sum(len(rows) for rows in got.values())
    return {"core": CORE, "digest": h.hexdigest(), "made": made}


if __name__ == "__main__":
    json.dump(digest(), sys.stdout)

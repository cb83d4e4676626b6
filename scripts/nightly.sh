#!/usr/bin/env bash
# The nightly target: what is too long for every push. First the tests marked nightly (a 40 s
# soak whose report is checked field by field, tests/integration/test_soak.py), then a soak of half
# an hour (or $1 seconds): broker, simulator with restarts and bad messages, the job, then the
# independent checker of safety, liveness, accounting and memory.
# Exit status: pytest's when a test failed, else the soak's (0 all checks pass, 1 safety failed,
# 3 liveness or accounting failed, 2 the run failed).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/pytest -q -m nightly
duration="${1:-1800}"
report="${SAFEPOINT_NIGHTLY_REPORT:-soak-nightly.json}"
exec .venv/bin/safepoint soak --duration "$duration" --bad-rate 0.002 --report "$report"

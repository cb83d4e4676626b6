#!/usr/bin/env bash
# Set up, then run lint, type checks and the whole test suite (unit, properties, integration
# against the embedded broker and a real Spark session). Extra arguments go to pytest.
# Three pytest workers (SAFEPOINT_TEST_WORKERS; 0: one process), each with its own broker and Spark
# session. The run keeps both cores busy, yet a third worker still shortened it (pytest 777 -> 653 s
# here, with the demo and bench tests' cuts): one worker's JVM start or batch wait fills the others' gaps.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy (strict, project packages)"
./scripts/typecheck.sh
echo "== pytest"
set +e
workers="${SAFEPOINT_TEST_WORKERS:-3}"
if [ "$workers" = "0" ]; then
  .venv/bin/pytest "$@"
else
  .venv/bin/pytest -n "$workers" --dist worksteal "$@"
fi
rc=$?
set -e
if [ "$rc" = "5" ]; then
  echo "test: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"

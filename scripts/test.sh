#!/usr/bin/env bash
# Set up, then run lint, type checks and the whole test suite (unit, properties, integration
# against the embedded broker and a real Spark session). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy (strict, project packages)"
./scripts/typecheck.sh
echo "== pytest"
set +e
.venv/bin/pytest "$@"
rc=$?
set -e
if [ "$rc" = "5" ]; then
  echo "test: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"

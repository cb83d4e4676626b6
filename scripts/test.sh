#!/usr/bin/env bash
# Set up, then run lint, type checks, the Go and Java clients' unit tests and the whole test suite
# (unit, properties, integration against the embedded broker, Apache Kafka and a real Spark session).
# Extra arguments go to pytest.
# Three pytest workers (SAFEPOINT_TEST_WORKERS; 0: one process), each with its own broker and Spark
# session. Most of a test's time is waiting (a JVM starting, a batch, a broker's answer): with two
# workers a clean-clone run used 0.8 cores of 2 on average (pytest 517 s), with three 0.9 cores
# (457 s). A third once overloaded 2 cores (a Python worker missed Spark's 10 s connect-back);
# since every Python process imports compiled modules, not PySpark's zip, they start in a fifth
# of the time.
set -euo pipefail
cd "$(dirname "$0")/.."
SAFEPOINT_SETUP_CLASSES=later SAFEPOINT_SETUP_CORE=later ./scripts/setup.sh
# Spark's class-data archive (about 40 s, mostly one core) and the compiled core (about 30 s on two)
# build while ruff and mypy run; the tests run the compiled core (tests/unit/test_compiled_core.py
# compares it with the core as Python)
.venv/bin/safepoint spark-classes --if-missing >/dev/null 2>.venv/spark-classes.log &
classes=$!
.venv/bin/python scripts/build_core.py >.venv/build-core.log 2>&1 &
core=$!
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy (strict, project packages)"
./scripts/typecheck.sh
# The node clients in Go and Java: their own checks and unit tests (setup built them; the tests below
# run their drivers against the brokers)
echo "== go vet, go test (clients/go)"
(cd clients/go && go vet ./... && go test -count=1 ./...)
echo "== mvn test (clients/java)"
mvn -q -B -Dstyle.color=never -f clients/java/pom.xml test 2>&1 | sed 's/\x1b\[[0-9;]*m//g'  # Maven's colour resets
if ! wait "$classes"; then
  echo "test: the Spark class-data archive could not be built (.venv/spark-classes.log); Spark starts without it" >&2
fi
if ! wait "$core"; then
  echo "test: the compiled core could not be built (.venv/build-core.log)" >&2
  tail -20 .venv/build-core.log >&2
  exit 1
fi
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

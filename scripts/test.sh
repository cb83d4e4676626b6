#!/usr/bin/env bash
# Set up, then run lint, type checks, the Go and Java clients' unit tests and the whole test suite
# (unit, properties, integration against the embedded broker, Apache Kafka and a real Spark session).
# Extra arguments go to pytest.
# Four pytest workers (SAFEPOINT_TEST_WORKERS; 0: one process), each with its own broker and Spark
# session. A test's time is mostly waiting (a JVM starting, a batch, a broker's answer) and the
# container tests' JVMs share the same 2 cores: on a clean clone with the images built, pytest took
# 863 s with three workers and 809 s with four (the cores 95% busy), the whole command 961 and
# 939 s; with the test brokers' class-data archive, 757 and 847 s; on a fresh machine, the images
# built cold beside ruff and mypy (186 s), 787 and 1015 s.
set -euo pipefail
cd "$(dirname "$0")/.."
SAFEPOINT_SETUP_CLASSES=later SAFEPOINT_SETUP_CORE=later ./scripts/setup.sh

# The container tests' Docker engine: the one that answers, else Debian's dockerd started here as root
# (scripts/engine.sh) and stopped when the tests end. Without one they fail in CI and skip elsewhere,
# saying why. Whatever the tests leave behind on any way out (a run killed mid-test) is removed here:
# their containers and networks (label dev.safepoint.test) and the compose projects they made (sptest*).
engine_started=""
if ! ./scripts/engine.sh status >/dev/null 2>&1; then
  if ./scripts/engine.sh start; then
    engine_started=1
  else
    echo "test: no Docker engine: the container tests fail in CI (they skip elsewhere)" >&2
  fi
fi
sweep_containers() {
  ./scripts/engine.sh status >/dev/null 2>&1 || return 0
  local project
  for project in $(docker ps -a --format '{{.Label "com.docker.compose.project"}}' | grep '^sptest' | sort -u); do
    COMPOSE_PROJECT_NAME="$project" docker-compose -f docker/compose.yaml down -v --remove-orphans >/dev/null 2>&1 || true
  done
  docker ps -aq --filter label=dev.safepoint.test | xargs -r docker rm -f -v >/dev/null 2>&1 || true
  docker network ls -q --filter label=dev.safepoint.test | xargs -r docker network rm >/dev/null 2>&1 || true
}
finish() {
  sweep_containers
  if [ -n "$engine_started" ]; then
    ./scripts/engine.sh stop
  fi
}
trap finish EXIT
# the images (scripts/images.sh: cached, seconds when built; minutes on a fresh machine) build beside
# the checks below
images=""
if [ -n "$engine_started" ] || ./scripts/engine.sh status >/dev/null 2>&1; then
  sweep_containers
  ./scripts/images.sh >.venv/images.log 2>&1 &
  images=$!
fi
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
echo "== go vet, go test -race (clients/go)"
(cd clients/go && go vet ./... && go test -race -count=1 ./...)
echo "== mvn verify (clients/java)"
mvn -q -B -Dstyle.color=never -f clients/java/pom.xml verify 2>&1 | sed 's/\x1b\[[0-9;]*m//g'  # Maven's colour resets
if ! wait "$classes"; then
  echo "test: the Spark class-data archive could not be built (.venv/spark-classes.log); Spark starts without it" >&2
fi
if [ -n "$images" ] && ! wait "$images"; then
  echo "test: the images could not be built (.venv/images.log); the container tests fail" >&2
  tail -20 .venv/images.log >&2
fi
if ! wait "$core"; then
  echo "test: the compiled core could not be built (.venv/build-core.log)" >&2
  tail -20 .venv/build-core.log >&2
  exit 1
fi
echo "== pytest"
set +e
workers="${SAFEPOINT_TEST_WORKERS:-4}"
if [ "$workers" = "0" ]; then
  .venv/bin/pytest --durations=20 "$@"
else
  .venv/bin/pytest -n "$workers" --dist worksteal --durations=20 "$@"
fi
rc=$?
set -e
if [ "$rc" = "5" ]; then
  echo "test: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"

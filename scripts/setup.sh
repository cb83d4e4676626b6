#!/usr/bin/env bash
# Sets up everything safepoint needs on a fresh machine: Java check (and install where
# possible), a virtualenv in .venv, the project and its pinned dependencies (PySpark, the
# embedded broker noida-db, confluent-kafka), Apache Kafka and Spark's Kafka connector from Maven
# Central (into .jars/), the Go and Java node clients (clients/). Idempotent: a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${SAFEPOINT_PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
      PY="$cand"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "setup: Python 3.11 is required (set SAFEPOINT_PYTHON=/path/to/python3.11)" >&2
  exit 1
fi

java_major() {
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1
}
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: Java 17+ not found; installing openjdk-17-jre-headless with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  fi
fi
if ! command -v java >/dev/null 2>&1; then
  echo "setup: Java not found. Spark needs Java 17 or newer:" >&2
  echo "       Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless; macOS: brew install openjdk@17" >&2
  exit 1
fi
echo "setup: $("$PY" --version), java $(java_major)"

# Tools some tests use, in one apt-get run: Debian's kcat (the guide's shell examples), chromium
# and chromium-driver (the dashboard's browser test), prometheus (the test that scrapes /metrics
# with a real Prometheus, promtool for the alert rules), docker.io, docker-compose and mmdebstrap
# (the images, made here from Debian's packages where no registry serves the base, and the container
# tests: scripts/images.sh, scripts/engine.sh), etcd-server, etcd-client (the etcd agent's tests and example) and
# postgresql (the PostgreSQL agent's tests and example: servers run as the postgres user, on loopback)
# and mariadb-server (the MariaDB agent's: servers of their own as the mysql user; Debian's service
# is not used), gcc (the Go client's race detector needs cgo; the core's mypyc build a C compiler)
missing=()
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
command -v kcat >/dev/null 2>&1 || command -v kafkacat >/dev/null 2>&1 || missing+=(kcat)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v mariadb-install-db >/dev/null 2>&1 || missing+=(mariadb-server)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${missing[*]} with apt-get (for the tests that use them)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null) \
      || echo "setup: ${missing[*]} could not be installed; their tests will be skipped (and fail in CI)" >&2
  else
    echo "setup: ${missing[*]} not found (apt-get install ${missing[*]}); their tests will be skipped (and fail in CI)" >&2
  fi
fi

# Apache Kafka (KRaft) and Spark's Kafka connector from Maven Central, into .jars/ (scripts/jars.sh; a
# second run checks a stamp and does nothing): the tests run them, the images copy them
./scripts/jars.sh || true

# The node clients in Go and Java (clients/go, clients/java) and their conformance drivers, which the
# tests run beside the Python client's; their modules come from the Go module proxy and Maven Central.
# Each driver script builds again by itself when a source is newer than its build.
build_client() {  # name, its log, then the build command
  local name="$1" log="$2"
  shift 2
  if ! "$@" >"$log" 2>&1; then
    echo "setup: could not build the $name client ($log); its tests fail" >&2
    tail -5 "$log" >&2
  else
    rm -f "$log"
  fi
}
build_clients() {
  if command -v go >/dev/null 2>&1; then
    build_client Go .clients-go.log go -C clients/go build -o bin/safepoint-driver ./cmd/safepoint-driver
  else
    echo "setup: Go not found: the Go client (clients/go, Go 1.26 or newer) is not built and its tests fail" >&2
  fi
  local jar=clients/java/driver/target/safepoint-driver-0.1.0.jar
  if [ -f "$jar" ] && [ -z "$(find clients/java -path '*/target' -prune -o -type f -newer "$jar" -print -quit)" ]; then
    :  # built, and no source changed since
  elif command -v mvn >/dev/null 2>&1; then
    build_client Java .clients-java.log mvn -q -B -Dstyle.color=never -f clients/java/pom.xml -DskipTests package
  else
    echo "setup: Maven not found: the Java client (clients/java) is not built and its tests fail" >&2
  fi
}
build_clients

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
stamp=.venv/.safepoint-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  # PYTHONWARNINGS: the build backend's boxed warning that an editable install maps folders of this tree
  # --no-compile: pip compiles one module at a time, test folders included (41 s instead of 21)...
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q --no-compile -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
  # ...then compiled in parallel, test folders left out (about 12 s on 2 cores): where
  # PYTHONDONTWRITEBYTECODE is set, nothing imported is ever cached, and without compiled modules
  # every Python process Spark starts compiles pandas, pyarrow and PySpark again (a job's start to
  # its first batch: 38 CPU-s instead of 27)
  .venv/bin/python -m compileall -q -j 0 -x 'site-packages/.*/tests?/' "$site" >/dev/null 2>&1 || true
  .venv/bin/python -c "import pyspark, confluent_kafka, noida_db, safepoint.streaming, safepoint.connectors" 
  touch "$stamp"
fi
# every Python of this environment that Spark starts imports the installed PySpark, not the zip
# copy Spark puts first on its path (streaming/worker_daemon.py: the processes Spark starts
# without its daemon setting, such as data source planning and the source's offset runner)
cp scripts/safepoint-spark-path.pth "$site/"
# this project's own modules, compiled each run (quick when nothing changed), for the same reason
.venv/bin/python -m compileall -q -j 0 src streaming connectors schemas >/dev/null 2>&1 || true
# The core compiled by mypyc (scripts/build_core.py; about 30 s on 2 cores, quick when current): it
# runs about twice as fast as the same modules as Python. Without a C compiler the core runs as Python.
# (SAFEPOINT_SETUP_CORE=later: the caller builds it, as scripts/test.sh does beside ruff and mypy)
if [ "${SAFEPOINT_SETUP_CORE:-}" != "later" ] && ! .venv/bin/python scripts/build_core.py >.venv/build-core.log 2>&1; then
  echo "setup: the compiled core could not be built (.venv/build-core.log); the core runs as Python" >&2
fi
# Spark's class-data archive (streaming/classes.py): every Spark JVM of the project then starts a
# few seconds sooner. Made once per environment by running the job once (about a minute).
# (SAFEPOINT_SETUP_CLASSES=later: the caller builds it, as scripts/test.sh does beside ruff and mypy)
if [ "${SAFEPOINT_SETUP_CLASSES:-}" != "later" ] \
   && ! .venv/bin/safepoint spark-classes --if-missing >/dev/null 2>.venv/spark-classes.log; then
  echo "setup: the Spark class-data archive could not be built (.venv/spark-classes.log); Spark starts without it" >&2
fi
echo "setup: ready (.venv/bin/safepoint)"

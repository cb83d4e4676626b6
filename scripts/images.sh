#!/usr/bin/env bash
# Build the images docker/compose.yaml and the container tests run, each from its Dockerfile, FROM
# debian:bookworm-slim, and print each one's size:
#   safepoint:VERSION            docker/Dockerfile: the job, serve, the agents, the simulator, Spark's master and workers
#   safepoint-kafka:VERSION      docker/kafka/Dockerfile: Apache Kafka (KRaft) from .jars/kafka, set up as apache/kafka is
#   safepoint-postgres:15        docker/postgres/Dockerfile: Debian's PostgreSQL 15, set up as the official postgres is
#   safepoint-prometheus:bookworm docker/prometheus/Dockerfile: Debian's Prometheus and promtool
# The base is pulled where a registry serves it; where none does it is made here from Debian's packages
# (mmdebstrap from this machine's apt sources, then docker import) and tagged debian:bookworm-slim, so one
# Dockerfile serves both. What the images install comes from what the project pins: Debian's packages,
# the jars scripts/jars.sh installs and the wheels gathered here into .images/wheels (the versions of
# .venv where setup made one: what the tests ran). Cached: a second run reuses the base, the wheels and
# every layer (seconds). Where the official Kafka, PostgreSQL or Prometheus image cannot be pulled,
# docker/.env names the one made here, so that `docker-compose -f docker/compose.yaml up` takes it with
# no more flags. A Docker engine is started where none answers (scripts/engine.sh, as root); it is left
# running (./scripts/engine.sh stop stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

# what it needs from Debian, installed as root where missing: the engine and the compose command, mmdebstrap
# (the base, where no registry serves it), Maven (the jars)
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v mvn >/dev/null 2>&1 || need+=(maven)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "images: installing ${need[*]} with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "images: ${need[*]} not found (apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

./scripts/engine.sh start >&2
./scripts/jars.sh kafka spark-kafka >&2

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/jars/kafka/pom.xml)
BASE=debian:bookworm-slim
# the wheels are gathered with a Python 3.11 (the image's): the environment's, else the machine's
PY="${SAFEPOINT_PYTHON:-}"
for cand in .venv/bin/python python3.11 python3; do
  [ -n "$PY" ] && break
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    PY="$cand"
  fi
done
if [ -z "$PY" ]; then
  echo "images: Python 3.11 is required to gather the image's wheels (set SAFEPOINT_PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
mkdir -p .images

have() { docker image inspect "$1" >/dev/null 2>&1; }
pulled() {  # pull $1 within a minute; no registry: fail at once
  timeout 60 docker pull -q "$1" >/dev/null 2>&1
}

# -- the base -----------------------------------------------------------------------------------
if have "$BASE"; then
  echo "images: $BASE is here"
elif pulled "$BASE"; then
  echo "images: $BASE pulled"
else
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    echo "images: $BASE cannot be pulled and mmdebstrap is not installed to make it (apt-get install mmdebstrap)" >&2
    exit 1
  fi
  # the machine's own apt sources for bookworm (deb822 or one-line), pasted into the root's sources
  sources=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -q bookworm "$f" && grep -qv '^\s*#' "$f" && sources+=("$f")
  done
  if [ "${#sources[@]}" -eq 0 ]; then
    echo "images: no apt source of Debian bookworm on this machine to make $BASE from" >&2
    exit 1
  fi
  echo "images: $BASE cannot be pulled: making it from Debian's packages (mmdebstrap, ${sources[*]})"
  t=$(date +%s)
  # minbase with the slim image's exclusions (no manuals, documents but copyrights, translations)
  mmdebstrap --quiet --variant=minbase \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' --dpkgopt='path-exclude=/usr/share/groff/*' \
    --aptopt='APT::Install-Recommends "false"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm .images/base.tar "${sources[@]}"
  docker import --change 'CMD ["bash"]' .images/base.tar "$BASE" >/dev/null
  rm -f .images/base.tar
  echo "images: $BASE made in $(( $(date +%s) - t )) s"
fi

# -- the wheels the safepoint image installs ---------------------------------------------------------
wheels() {
  local req=.images/requirements.txt constraints=.images/constraints.txt want
  { "$PY" docker/requirements.py pyproject.toml job serve etcd postgres mariadb
    echo "setuptools>=77"
    grep -o 'mypy==[0-9.]*' pyproject.toml; } >"$req"
  : >"$constraints"
  if [ -x .venv/bin/python ]; then  # the versions the tests ran
    .venv/bin/python -m pip freeze --exclude-editable 2>/dev/null | grep -v -e '^-e ' -e '^safepoint' -e ' @ ' >"$constraints" || true
  fi
  want=$(cat "$req" "$constraints" | sha256sum | cut -c1-16)
  if [ -f .images/wheels/.stamp ] && [ "$(cat .images/wheels/.stamp)" = "$want" ]; then
    echo "images: wheels are current (.images/wheels)"
    return 0
  fi
  local t
  t=$(date +%s)
  rm -rf .images/wheels.new
  "$PY" -m pip wheel -q -w .images/wheels.new -r "$req" -c "$constraints" 2>&1 | grep -v "^WARNING: Location" || true
  if [ "$(ls .images/wheels.new 2>/dev/null | grep -c '\.whl$')" -eq 0 ]; then
    echo "images: could not gather the wheels the image installs (pip wheel -r $req)" >&2
    exit 1
  fi
  rm -rf .images/wheels
  mv .images/wheels.new .images/wheels
  echo "$want" >.images/wheels/.stamp
  echo "images: $(ls .images/wheels | grep -c '\.whl$') wheels gathered in $(( $(date +%s) - t )) s (.images/wheels)"
}
wheels

# -- the images ---------------------------------------------------------------------------------------
build() {  # tag, Dockerfile
  local t
  t=$(date +%s)
  # the build context is what the Dockerfile copies (its COPY sources), not the whole checkout: the
  # wheels go to the one image that installs them (docker-compose build sends the checkout, less what
  # .dockerignore leaves out)
  local -a context
  mapfile -t context < <(sed -n 's/^COPY \([^-].*\) [^ ]*$/\1/p' "$2" | tr ' ' '\n' | sed 's:/$::' | sort -u \
    | awk '{ for (i = 1; i <= n; i++) if (index($0, kept[i] "/") == 1) next; kept[++n] = $0; print }')  # a folder once
  if ! tar -cf - --exclude=__pycache__ --exclude='*.pyc' "$2" "${context[@]}" \
      | docker build --network host --force-rm -q -f "$2" -t "$1" - >.images/build.log 2>&1; then
    echo "images: building $1 ($2) failed; its output ends:" >&2
    tail -20 .images/build.log >&2
    exit 1
  fi
  echo "images: $1 built in $(( $(date +%s) - t )) s"
}
build "safepoint-kafka:$KAFKA_VERSION" docker/kafka/Dockerfile
build "safepoint-postgres:15" docker/postgres/Dockerfile
build "safepoint-prometheus:bookworm" docker/prometheus/Dockerfile
build "safepoint:$VERSION" docker/Dockerfile

# -- which third-party image docker/compose.yaml takes ---------------------------------------------
# (the official one where it can be pulled, else the one made here; a value set in the environment or in
# an existing docker/.env stands)
choose() {  # variable, official image, the one made here
  local current=""
  [ -f docker/.env ] && current=$(sed -n "s/^$1=//p" docker/.env | tail -1)
  if [ -n "${!1:-}" ] || { [ -n "$current" ] && [ "$current" != "$3" ]; }; then
    echo "images: $1 stays ${!1:-$current}"
  elif have "$2" || pulled "$2"; then
    [ -f docker/.env ] && sed -i "/^$1=/d" docker/.env
    echo "images: $1: the official $2"
  else
    touch docker/.env
    sed -i "/^$1=/d" docker/.env
    echo "$1=$3" >>docker/.env
    echo "images: $1: $2 cannot be pulled; docker/.env names $3"
  fi
}
choose KAFKA_IMAGE "apache/kafka:$KAFKA_VERSION" "safepoint-kafka:$KAFKA_VERSION"
choose POSTGRES_IMAGE "postgres:15-bookworm" "safepoint-postgres:15"
choose PROMETHEUS_IMAGE "prom/prometheus:v2.42.0" "safepoint-prometheus:bookworm"

# the compose project's name (its containers safepoint_kafka1_1, ...), unless docker/.env names another
if ! grep -q '^COMPOSE_PROJECT_NAME=' docker/.env 2>/dev/null; then
  echo "COMPOSE_PROJECT_NAME=safepoint" >>docker/.env
fi

echo "images: ready in $(( $(date +%s) - started )) s"
for image in "$BASE" "safepoint:$VERSION" "safepoint-kafka:$KAFKA_VERSION" safepoint-postgres:15 safepoint-prometheus:bookworm; do
  printf '  %-32s %6s MB\n' "$image" "$(( $(docker image inspect --format '{{.Size}}' "$image") / 1000000 ))"
done

#!/usr/bin/env bash
# A Docker engine for the images and the container tests.
#   ./scripts/engine.sh status   exit 0 when an engine answers (`docker info`), else say why and exit 1
#   ./scripts/engine.sh start    an engine answers afterwards: the one already running, or, as root, Debian's
#                                dockerd started here (prints "engine: started pid N"; exit 1 with what to do when
#                                it cannot be); "engine: running" when one already answered
#   ./scripts/engine.sh stop     stop the engine this script started (its pid file), and only that one
# The engine started here keeps its images in /var/lib/docker (a second start finds them), listens on
# /var/run/docker.sock as a packaged one does, and makes no default bridge nor iptables rules
# (--bridge=none --iptables=false): containers reach each other on the networks compose and the tests
# make, and the host reaches them there; nothing is published beyond what a compose file binds to
# 127.0.0.1. Its log: /var/log/safepoint-dockerd.log.
set -euo pipefail

PIDFILE=/var/run/safepoint-dockerd.pid
LOG=/var/log/safepoint-dockerd.log

answers() {
  docker info --format '{{.ServerVersion}}' >/dev/null 2>&1
}
running() {  # say so and end here when an engine answers
  if answers; then
    echo "engine: running (Docker $(docker info --format '{{.ServerVersion}}'))"
    exit 0
  fi
}

case "${1:-status}" in
  status)
    running
    if ! command -v docker >/dev/null 2>&1; then
      echo "engine: no docker command (apt-get install docker.io; scripts/setup.sh installs it as root)" >&2
    else
      echo "engine: no Docker engine answers (docker info: $(docker info 2>&1 | tail -1)); ./scripts/engine.sh start starts one as root" >&2
    fi
    exit 1
    ;;
  start)
    running
    if ! command -v dockerd >/dev/null 2>&1; then
      echo "engine: no Docker engine answers and dockerd is not installed (apt-get install docker.io; scripts/setup.sh installs it as root)" >&2
      exit 1
    fi
    if [ "$(id -u)" != "0" ]; then
      echo "engine: no Docker engine answers; start one (sudo ./scripts/engine.sh start, or your system's docker service)" >&2
      exit 1
    fi
    mkdir -p /var/lib/docker /var/run/safepoint-docker
    # setsid: the engine outlives this shell and is not in the caller's process group (a Ctrl-C to the
    # tests does not reach it); stop ends it by its pid
    setsid dockerd --data-root /var/lib/docker --exec-root /var/run/safepoint-docker --pidfile "$PIDFILE" \
      --host unix:///var/run/docker.sock --bridge=none --iptables=false --ip6tables=false \
      >>"$LOG" 2>&1 </dev/null &
    for _ in $(seq 1 120); do
      if answers; then
        echo "engine: started pid $(cat "$PIDFILE") (Docker $(docker info --format '{{.ServerVersion}}'), log $LOG)"
        exit 0
      fi
      sleep 0.25
    done
    echo "engine: dockerd did not answer within 30 s; its log ($LOG) ends:" >&2
    tail -5 "$LOG" >&2
    exit 1
    ;;
  stop)
    if [ ! -f "$PIDFILE" ]; then
      echo "engine: none started here (no $PIDFILE): nothing to stop"
      exit 0
    fi
    pid=$(cat "$PIDFILE")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 120); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
      done
      if kill -0 "$pid" 2>/dev/null; then
        echo "engine: dockerd $pid did not stop within 30 s; killed" >&2
        kill -9 "$pid" 2>/dev/null || true
      fi
    fi
    rm -f "$PIDFILE"
    echo "engine: stopped pid $pid"
    ;;
  *)
    echo "usage: $0 status|start|stop" >&2
    exit 2
    ;;
esac

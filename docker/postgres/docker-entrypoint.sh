#!/usr/bin/env bash
# The PostgreSQL image's entry point, as the official postgres image's: an empty PGDATA is made with initdb
# for POSTGRES_USER (postgres) with POSTGRES_PASSWORD (scram-sha-256 for every host; trust only when
# POSTGRES_HOST_AUTH_METHOD says so), POSTGRES_DB is created, then the server replaces this script,
# listening on every address of the container.
set -euo pipefail
if [ "${1:-}" = "postgres" ] || [ "${1:0:1}" = "-" ]; then
  [ "${1:-}" = "postgres" ] && shift
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  method="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$method" != "trust" ]; then
      echo "postgres: POSTGRES_PASSWORD is required (or POSTGRES_HOST_AUTH_METHOD=trust, which lets anyone in)" >&2
      exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host="$method" \
      --encoding=UTF8 --locale=C.UTF-8 ${POSTGRES_INITDB_ARGS:-} >/dev/null
    rm -f "$pwfile"
    printf "\nhost all all all %s\nlisten_addresses = '*'\n" "$method" | {
      read -r; read -r hba; read -r listen
      echo "$hba" >>"$PGDATA/pg_hba.conf"
      echo "$listen" >>"$PGDATA/postgresql.conf"
    }
    if [ "$db" != "postgres" ]; then
      postgres --single -D "$PGDATA" -c listen_addresses='' postgres <<<"CREATE DATABASE \"$db\";" >/dev/null
    fi
    echo "postgres: database cluster made in $PGDATA (user $user, database $db, host auth $method)"
  fi
  exec postgres -D "$PGDATA" "$@"
fi
exec "$@"

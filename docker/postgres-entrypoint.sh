#!/bin/sh
# Starts PostgreSQL in the image of docker/postgres.Dockerfile, as the official postgres
# image does: on the first start (an empty PGDATA) it makes the cluster with POSTGRES_USER
# as its superuser, that user's password from POSTGRES_PASSWORD_FILE or POSTGRES_PASSWORD
# (scram-sha-256 over the network; no password over the container's own socket) and the
# database POSTGRES_DB; then it runs the server, listening on every address of the
# container. The password goes to initdb in a file (never an argument: `ps` shows those).
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    password=$(cat "$POSTGRES_PASSWORD_FILE")
  else
    password=${POSTGRES_PASSWORD:-}
  fi
  if [ -z "$password" ]; then
    echo "postgres-entrypoint: set POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE)" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s\n' "$password" >"$pwfile"
  initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" --encoding=UTF8 \
    --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    # A server on the socket only (no network: nothing connects before it is ready).
    pg_ctl --pgdata="$PGDATA" --options="-c listen_addresses=''" --wait --silent start
    createdb --username="$user" "$db"
    pg_ctl --pgdata="$PGDATA" --mode=fast --wait --silent stop
  fi
  echo "postgres-entrypoint: made the cluster in $PGDATA (user $user, database $db)"
fi
unset POSTGRES_PASSWORD
exec postgres -D "$PGDATA" -c listen_addresses='*'

#!/usr/bin/env bash
# Builds the PostgreSQL 15 image of docker/postgres.Dockerfile (Debian's postgresql-15
# package) for docker/compose.team.yaml, where no image registry is reachable to pull
# postgres:15 from.
#
# Usage: GRADWATCH_POSTGRES_IMAGE=$(scripts/docker-postgres.sh)
#   Prints the image name as its last line. The base is GRADWATCH_BASE when set (any
#   Debian bookworm image), else the one scripts/docker-base.sh makes with debootstrap.
#   A second run is a build-cache hit (seconds).
#
# Environment: DOCKER (client, default `docker`), DOCKER_HOST, GRADWATCH_BASE, and those of
# scripts/docker-base.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
docker=${DOCKER:-docker}
image=gradwatch-postgres:15

base=${GRADWATCH_BASE:-}
if [[ -z $base ]]; then
  base=$(bash "$here/docker-base.sh" | tail -n 1)
fi
echo "docker-postgres: building $image on $base" >&2
# The context is docker/ (the Dockerfile copies its entrypoint from there); the build's
# output is shown only when it fails.
if ! out=$("$docker" build -f "$repo/docker/postgres.Dockerfile" --build-arg "BASE=$base" \
  -t "$image" "$repo/docker" 2>&1); then
  echo "$out" | tail -n 30 >&2
  echo "docker-postgres: the build failed" >&2
  exit 1
fi
echo "$image"

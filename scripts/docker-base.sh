#!/usr/bin/env bash
# Makes the base image for docker/Dockerfile where no image registry can be reached:
# a minimal Debian bookworm with python3, venv, pip and CA certificates, built with
# debootstrap from Debian's own mirror and loaded with `docker import`.
#
# Usage: scripts/docker-base.sh [--tarball-only]
#   Prints the image name (for `docker build --build-arg BASE=...`) as its last line.
#   --tarball-only: make or reuse the root filesystem tarball and stop (no engine needed).
#
# Two caches, so a warm run takes seconds: the image itself in the engine (checked with
# `docker image inspect`) and the root filesystem tarball under $GRADWATCH_CACHE
# (default /var/cache/gradwatch), which survives a wiped engine. The tag carries a hash
# of the recipe below, so changing the package list or suite makes a new image.
#
# Environment: DOCKER (client, default `docker`), DOCKER_HOST, GRADWATCH_CACHE,
# GRADWATCH_DEBIAN_MIRROR (default http://deb.debian.org/debian). Needs root for
# debootstrap; installs debootstrap with apt-get when it is missing.
set -euo pipefail

suite=bookworm
mirror=${GRADWATCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=python3,python3-venv,python3-pip,ca-certificates
cache=${GRADWATCH_CACHE:-/var/cache/gradwatch}
docker=${DOCKER:-docker}

recipe="$suite minbase $packages v1"
hash=$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
image=gradwatch-base:$suite-$hash
tarball=$cache/base-$suite-$hash.tar.gz

log() { echo "docker-base: $*" >&2; }

make_tarball() {
  if [[ -s $tarball ]]; then
    log "reusing $tarball"
    return
  fi
  if [[ $(id -u) != 0 ]]; then
    log "debootstrap needs root"; exit 1
  fi
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  mkdir -p "$cache"
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  # The root filesystem holds device nodes and proc mounts while debootstrap runs:
  # unmount before removing, and remove even when the build fails half way.
  trap 'umount -R "$root/proc" "$root/sys" 2>/dev/null || true; rm -rf "$root" "$tarball.tmp"' EXIT
  log "debootstrap $suite ($packages) from $mirror: a few minutes"
  debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" \
    >"$cache/debootstrap.log" 2>&1 || {
    log "debootstrap failed; the end of $cache/debootstrap.log:"
    tail -n 20 "$cache/debootstrap.log" >&2
    exit 1
  }
  # A base image needs no package lists, downloaded .debs, docs or locales: smaller
  # tarball, faster import.
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
    "$root"/usr/share/locale/* "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
  tar --numeric-owner -C "$root" -czf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$root"
  trap - EXIT
  log "wrote $tarball ($(du -h "$tarball" | cut -f1))"
}

make_tarball
if [[ ${1:-} == --tarball-only ]]; then
  echo "$tarball"
  exit 0
fi

if "$docker" image inspect "$image" >/dev/null 2>&1; then
  log "image $image already in the engine"
else
  log "importing $tarball as $image"
  "$docker" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    "$tarball" "$image" >/dev/null
fi
echo "$image"

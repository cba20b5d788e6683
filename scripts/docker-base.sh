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
# GRADWATCH_DEBIAN_MIRROR (default: the mirror this machine's apt uses for the suite).
# Needs root for debootstrap; installs debootstrap with apt-get when it is missing.
set -euo pipefail

suite=bookworm
packages=python3,python3-venv,python3-pip,ca-certificates
cache=${GRADWATCH_CACHE:-/var/cache/gradwatch}
docker=${DOCKER:-docker}

recipe="$suite minbase $packages v2"
hash=$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
image=gradwatch-base:$suite-$hash
tarball=$cache/base-$suite-$hash.tar

log() { echo "docker-base: $*" >&2; }

# The mirror that apt on this machine uses for "$suite main" (deb822 .sources files or
# one-line .list files), so debootstrap fetches from wherever apt-get is set up to.
apt_mirror() {
  python3 - "$suite" <<'PY'
import glob, re, sys

suite = sys.argv[1]
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in re.split(r"\n\s*\n", open(path, encoding="utf-8").read()):
        fields: dict[str, list[str]] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.split()
        if ("deb" in fields.get("types", []) and suite in fields.get("suites", [])
                and "main" in fields.get("components", [])
                and fields.get("enabled", ["yes"])[0].lower() != "no" and fields.get("uris")):
            print(fields["uris"][0].rstrip("/"))
            sys.exit(0)
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        continue
    for line in lines:
        m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
        if m and m.group(2) == suite and "main" in m.group(3).split():
            print(m.group(1).rstrip("/"))
            sys.exit(0)
sys.exit(1)
PY
}

make_tarball() {
  if [[ -s $tarball ]]; then
    log "reusing $tarball"
    return
  fi
  if [[ $(id -u) != 0 ]]; then
    log "debootstrap needs root (where a registry is reachable, use a registry image"
    log "instead: GRADWATCH_DOCKER_BASE=python:3.11-slim for the image test)"
    exit 1
  fi
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  local mirror=${GRADWATCH_DEBIAN_MIRROR:-}
  if [[ -z $mirror ]] && ! mirror=$(apt_mirror); then
    log "no apt source for '$suite main' on this machine: set GRADWATCH_DEBIAN_MIRROR"
    exit 1
  fi
  mkdir -p "$cache"
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  # The root filesystem has proc mounted while debootstrap configures it: unmount before
  # removing, never cross into a mount, and clean up even when the build fails half way.
  trap 'umount -R "$root/proc" "$root/sys" 2>/dev/null || true
        rm -rf --one-file-system "$root" "$tarball.tmp"' EXIT
  log "debootstrap $suite ($packages) from $mirror: a minute or two"
  # Two stages so that dpkg in the second runs with force-unsafe-io: no fsync per file,
  # which is most of the install time, and nothing is lost since a failed build is
  # thrown away whole.
  if debootstrap --foreign --variant=minbase --include="$packages" "$suite" "$root" "$mirror" \
    >"$cache/debootstrap.log" 2>&1; then
    echo force-unsafe-io >"$root/etc/dpkg/dpkg.cfg.d/gradwatch-build"
    chroot "$root" /debootstrap/debootstrap --second-stage >>"$cache/debootstrap.log" 2>&1 ||
      failed=1
  else
    failed=1
  fi
  if [[ -n ${failed:-} ]]; then
    log "debootstrap failed; the end of $cache/debootstrap.log:"
    tail -n 20 "$cache/debootstrap.log" >&2
    exit 1
  fi
  # A base image needs no package lists, downloaded .debs, docs or locales.
  chroot "$root" apt-get clean
  rm -rf "$root"/etc/dpkg/dpkg.cfg.d/gradwatch-build "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* \
    "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
  # Uncompressed: compressing costs more time than the disk it saves.
  tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  # Tarballs of earlier recipes are dead weight now.
  find "$cache" -maxdepth 1 -name "base-$suite-*.tar*" ! -path "$tarball" -delete
  rm -rf --one-file-system "$root"
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

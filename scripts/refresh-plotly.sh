#!/usr/bin/env bash
# Fetches the plotly.js bundle that the dashboard loads into web/vendor/, from the npm
# registry by exact version, and checks it against the sha256 recorded in the repository.
#
# Usage: scripts/refresh-plotly.sh [--out DIR] [--pin VERSION] [--package NAME]
#   (no option)     re-fetch the pinned version (DIR/plotly.lock) and write it only if
#                   every file matches DIR/SHA256SUMS; a mismatch exits 1 and writes nothing.
#   --pin VERSION   move the pin: fetch VERSION (of --package, default the pinned package),
#                   write it and record its package, version and sha256 anew. Review the
#                   diff, then run with no option to confirm the download is reproducible.
#   --out DIR       where the bundle and its record live (default web/vendor).
# npm itself checks the tarball against the registry's integrity hash; the sha256 here pins
# the bytes the dashboard serves, whatever the registry says later.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$repo/web/vendor pin="" package=""
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --pin) pin=$2; shift 2 ;;
    --package) package=$2; shift 2 ;;
    *) echo "usage: scripts/refresh-plotly.sh [--out DIR] [--pin VERSION] [--package NAME]" >&2
       exit 2 ;;
  esac
done
out=$(realpath -m "$out")
lock=$out/plotly.lock sums=$out/SHA256SUMS
log() { echo "refresh-plotly: $*" >&2; }

field() { sed -n "s/^$1=//p" "$lock" 2>/dev/null; }
package=${package:-$(field package)}
version=${pin:-$(field version)}
if [[ -z $package || -z $version ]]; then
  log "no package/version: $lock is missing or incomplete (use --package NAME --pin VERSION)"
  exit 2
fi
if [[ -z $pin && ! -s $sums ]]; then
  log "$sums is missing: nothing to check the download against"
  exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "fetching $package@$version from the npm registry"
npm pack --silent --pack-destination "$tmp" "$package@$version" >/dev/null
tar -xzf "$tmp"/*.tgz -C "$tmp"
main=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["main"])' \
  "$tmp/package/package.json")
mkdir -p "$tmp/files"
cp "$tmp/package/$main" "$tmp/files/plotly.min.js"
cp "$tmp/package/LICENSE" "$tmp/files/LICENSE-plotly.js"
# The bundle's banner names its version: a mismatch means npm resolved something else.
if ! head -c 200 "$tmp/files/plotly.min.js" | grep -q "v$version\$"; then
  log "the bundle's banner does not say v$version"; exit 1
fi

if [[ -z $pin ]]; then
  if ! (cd "$tmp/files" && sha256sum --check --strict --quiet "$sums"); then
    log "the download does not match $sums: nothing written"
    exit 1
  fi
else
  (cd "$tmp/files" && sha256sum plotly.min.js LICENSE-plotly.js) > "$tmp/SHA256SUMS"
fi
mkdir -p "$out"
cp "$tmp/files/plotly.min.js" "$tmp/files/LICENSE-plotly.js" "$out/"
if [[ -n $pin ]]; then
  cp "$tmp/SHA256SUMS" "$sums"
  printf '%s\n' "# The plotly.js bundle in this folder: written by scripts/refresh-plotly.sh." \
    "package=$package" "version=$version" > "$lock"
  log "pinned $package@$version; new hashes:"; cat "$sums" >&2
fi
log "ok: $out/plotly.min.js is $package@$version ($(wc -c < "$out/plotly.min.js") bytes)"

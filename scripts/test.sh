#!/usr/bin/env bash
# The README's test command runs this: lint, types, then the whole pytest suite.
# Browser tests need Debian's chromium, the plotly.js refresh test npm, the Docker test
# docker.io and the storage tests' second backend PostgreSQL (a throwaway cluster per test
# process: tests/pgcluster.py); they are installed here when missing (root on Debian).
# GRADWATCH_SKIP_DOCKER=1 skips the image test. pytest runs a worker per core and one more
# (GRADWATCH_TEST_WORKERS to choose; 0: none): many tests wait on a subprocess, a server or
# a browser, and the extra worker uses that idle time; tests that share an expensive module
# fixture (the built wheel, the Docker engine, a DDP run) are one xdist_group, run by one
# worker; tests/conftest.py collects the long tests first, so the run ends on quick ones.
set -euo pipefail
venv=${1:-.venv}
bin=$venv/bin
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v npm >/dev/null || need+=(npm)  # scripts/refresh-plotly.sh, tested in tests/packaging
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
if [[ ${GRADWATCH_SKIP_DOCKER:-0} != 1 ]]; then
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  # Debian 12 ships no compose plugin: the README's Docker lines run through compose v1
  command -v docker-compose >/dev/null || need+=(docker-compose)
fi
if ((${#need[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "test: installing ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "test: missing ${need[*]} (not root or no apt-get): those tests will skip" >&2
  fi
fi
echo "test: ruff"; "$bin/ruff" check .
echo "test: mypy"; bash scripts/mypy.sh "$venv"
mkdir -p test-artifacts
echo "test: pytest"
"$bin/python" -m pytest -q -ra -n "${GRADWATCH_TEST_WORKERS:-$(($(nproc) + 1))}" --dist loadgroup \
  --durations=30 "${@:2}"

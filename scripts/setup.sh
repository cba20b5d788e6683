#!/usr/bin/env bash
# Creates the virtual environment and installs gradwatch with its server and dev extras.
# gradwatch does not require torch, but the probe, its tests and the demo run on it: the
# pinned CPU wheel goes in first, before anything (accelerate, in the dev extra) could pull
# torch from an open range, which would be a multi-GB CUDA build. The framework tests' pins
# (lightning, transformers, accelerate) accept that torch; the check at the end fails the
# set-up loudly if any of them replaced it all the same.
# pip runs quietly; each phase says what it does, and every 30 s that it still does it, so
# a first `make demo` (minutes of downloads) never sits silent.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}
started=$SECONDS

phase() {  # phase "what it does" command...: says so, then runs the command
  local what=$1 since=$SECONDS next=30
  shift
  echo "setup: $what"
  "$@" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - since >= next)); then
      echo "setup:   still ${what%% (*} ($((SECONDS - since)) s)"
      next=$((next + 30))
    fi
  done
  wait "$pid"  # its exit status: a failed phase stops the set-up (set -e)
}

if [[ ! -x $venv/bin/python ]]; then
  phase "creating the virtual environment $venv ($("$py" --version 2>&1))" "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
phase "updating pip" "${pip[@]}" install --upgrade pip
torch_version=${GRADWATCH_TORCH:-2.13.0}
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  what="installing torch==$torch_version, CPU build (about 200 MB to download, 750 MB"
  what+=" installed: the longest step, minutes on a slow link)"
  phase "$what" "${pip[@]}" install "torch==$torch_version" numpy
fi
what="installing gradwatch (editable) with its server and dev extras (fastapi, uvicorn,"
what+=" pytest, playwright, lightning, transformers, accelerate)"
phase "$what" "${pip[@]}" install -e ".[server,dev]"
echo "setup: checking that torch is still the CPU build $torch_version"
installed=$("$venv/bin/python" -c "import torch; print(torch.__version__)" 2>&1 || true)
if [[ $installed != "$torch_version+cpu" ]]; then
  echo "setup: FAILED: torch is now '$installed', not the CPU build $torch_version+cpu;" \
       "a dependency replaced it (check the pins in pyproject.toml's dev extra)" >&2
  exit 1
fi
echo "setup: ready in $venv ($((SECONDS - started)) s)"

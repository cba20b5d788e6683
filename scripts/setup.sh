#!/usr/bin/env bash
# Creates the virtual environment and installs gradwatch with its server and dev extras.
# gradwatch does not require torch, but the probe, its tests and the demo run on it: the
# pinned CPU wheel goes in first, before anything (accelerate, in the dev extra) could pull
# torch from an open range, which would be a multi-GB CUDA build.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}
if [[ ! -x $venv/bin/python ]]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing the CPU build of torch==${GRADWATCH_TORCH:-2.13.0}"
  "${pip[@]}" install "torch==${GRADWATCH_TORCH:-2.13.0}" numpy
fi
"${pip[@]}" install -e ".[server,dev]"
echo "setup: ready in $venv"

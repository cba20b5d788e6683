#!/usr/bin/env bash
# Creates the virtual environment and installs gradwatch with its server and dev extras.
# gradwatch does not require torch, but the probe, its tests and the demo run on it: the
# pinned CPU wheel goes in first, before anything (accelerate, in the dev extra) could pull
# torch from an open range, which would be a multi-GB CUDA build. The framework tests' pins
# (lightning, transformers, accelerate) accept that torch; the check at the end fails the
# set-up loudly if any of them replaced it all the same.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}
if [[ ! -x $venv/bin/python ]]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
torch_version=${GRADWATCH_TORCH:-2.13.0}
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing the CPU build of torch==$torch_version"
  "${pip[@]}" install "torch==$torch_version" numpy
fi
"${pip[@]}" install -e ".[server,dev]"
installed=$("$venv/bin/python" -c "import torch; print(torch.__version__)" 2>&1 || true)
if [[ $installed != "$torch_version+cpu" ]]; then
  echo "setup: FAILED: torch is now '$installed', not the CPU build $torch_version+cpu;" \
       "a dependency replaced it (check the pins in pyproject.toml's dev extra)" >&2
  exit 1
fi
echo "setup: ready in $venv"

#!/usr/bin/env bash
# mypy cannot follow setuptools' folder-to-package mapping (probe/ -> gradwatch.probe), so
# check a tree of symlinks laid out as the installed package.
set -euo pipefail
venv=${1:-.venv}
root=build/mypy
rm -rf "$root"; mkdir -p "$root/gradwatch"
for f in gradwatch/*.py; do ln -s "../../../$f" "$root/gradwatch/"; done
for d in integrations probe server web; do ln -s "../../../$d" "$root/gradwatch/$d"; done
MYPYPATH=$root "$venv/bin/mypy" -p gradwatch

#!/usr/bin/env bash
# Creates the project's Python environment in .venv (once) and installs
# what the Python tests use (python/requirements-dev.txt). Idempotent: a
# second run only checks that the requirements are met. Called by
# `make venv`, which `make test` runs.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
req="$root/python/requirements-dev.txt"
stamp="$venv/.requirements-dev.stamp"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# Reinstall only when the requirements changed since the last install.
if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp"; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    cp "$req" "$stamp"
fi

#!/usr/bin/env bash
# Builds the `fabrickv` Python extension module (crates/python) in release
# mode and installs it into the project's .venv (made by scripts/venv.sh).
# Called by `make python`. A second run recompiles only what changed and
# reinstalls the wheel (a few seconds).
#
# maturin builds in cargo's usual target directory (`target/`, or
# $CARGO_TARGET_DIR) and sets PYO3_BUILD_EXTENSION_MODULE itself, so the
# module does not link libpython.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/venv.sh"

# maturin installs into the environment named by VIRTUAL_ENV.
export VIRTUAL_ENV="$root/.venv"
"$VIRTUAL_ENV/bin/maturin" develop --release --quiet \
    --manifest-path "$root/crates/python/Cargo.toml"
# Fails here, not in the tests, if the module does not import.
"$VIRTUAL_ENV/bin/python" -c 'import fabrickv; print("fabrickv", fabrickv.__version__, "installed in .venv")'

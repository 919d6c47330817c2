#!/usr/bin/env bash
# Builds the `fabrickv` wheel into dist/: one abi3 wheel (CPython 3.11 and
# every later version, pyo3's `abi3-py311`), tagged manylinux by maturin
# after it checks the library's glibc symbol versions, so that `pip
# install dist/fabrickv-*.whl` needs no Rust toolchain. Called by `make
# wheel`; python/tests/test_wheel.py installs the result into a fresh venv.
#
# Stripped: the debug info of a release build (kept in target/ for
# profiling) would make the wheel several times larger.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/venv.sh"

mkdir -p "$root/dist"
# Only this build's wheel is left for the install test to pick.
rm -f "$root"/dist/fabrickv-*.whl
"$root/.venv/bin/maturin" build --release --strip --quiet \
    --manifest-path "$root/crates/python/Cargo.toml" --out "$root/dist"
ls "$root"/dist/fabrickv-*.whl

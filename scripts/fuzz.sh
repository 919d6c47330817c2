#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for FUZZ_SECONDS seconds each
# (default 60), installing cargo-fuzz first if it is missing. Called by
# `make fuzz`.
#
#   scripts/fuzz.sh                  # every target
#   scripts/fuzz.sh decode_frame     # only the named targets
#   FUZZ_SECONDS=600 scripts/fuzz.sh
#
# Needs a nightly toolchain (`rustup toolchain install nightly`). The
# corpus of each target grows under fuzz/corpus/<target>/ and is reused by
# later runs; a crash leaves its input under fuzz/artifacts/<target>/ and
# makes this script exit non-zero after the remaining targets have run.

set -euo pipefail

seconds="${FUZZ_SECONDS:-60}"
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/fuzz"

if ! cargo "+$toolchain" --version >/dev/null 2>&1; then
    echo "fuzz.sh: the $toolchain toolchain is missing; run: rustup toolchain install $toolchain" >&2
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo "+$toolchain" fuzz list)
fi

# One build for every target; each run below then starts at once.
cargo "+$toolchain" fuzz build

failed=()
for t in "${targets[@]}"; do
    # RESP and memcache targets get their tokens; the rest speak the
    # native protocol.
    case "$t" in
        resp*) dict="$root/fuzz/dicts/resp.dict" ;;
        memcache*) dict="$root/fuzz/dicts/memcache.dict" ;;
        *) dict="$root/fuzz/dicts/native.dict" ;;
    esac
    echo "== fuzz $t for ${seconds}s"
    if ! cargo "+$toolchain" fuzz run "$t" -- \
        -max_total_time="$seconds" \
        -dict="$dict" \
        -print_final_stats=1; then
        failed+=("$t")
        echo "fuzz.sh: $t failed; its input is under fuzz/artifacts/$t/" >&2
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz.sh: failing targets: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets ran ${seconds}s each with no crash"

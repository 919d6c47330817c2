#!/usr/bin/env bash
# The shard-copy benchmark (the RocksDB shard replicator's): a SIZE shard (10GB by default)
# of 16-byte keys and 256- then 128-byte uncompressible values, copied from
# a server to a directory on this machine, beside the raw pipe (the same
# bytes through a TCP socket into a file) measured in the same run. Writes
# the log and a rate plot per value size under bench-results/.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE="${SIZE:-10GB}"
DIR="${DIR:-/tmp/fabrickv-bench-copy}"
DATE="$(date +%F)"
cargo build --release -p fabrickv-cli
BIN=target/release/fabrickv
mkdir -p bench-results
for v in 256 128; do
    log="bench-results/$DATE-copy-$SIZE-${v}B.log"
    "$BIN" bench copy --size "$SIZE" --value-size "$v" --dir "$DIR" --clean \
        --plot "bench-results/$DATE-copy-$SIZE-${v}B.png" 2>&1 | tee "$log"
done

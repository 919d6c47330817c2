#!/usr/bin/env bash
# The foundation measurement: FabricKV pinned to CPU 0, load on CPU 1,
# GET of 16-byte keys with 32-byte values at batch depth 16, beside
# redis-server 7 with redis-benchmark -P 16 -d 32 -t get in the same run.
set -euo pipefail
BIN=${BIN:-target/release/fabrickv}
DURATION=${DURATION:-10}
echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) CPUs, $(redis-server --version | cut -d' ' -f1-3)"
for batch in 1 16; do
  "$BIN" bench kv --server-cpus 0 --client-cpus 1 --get-percent 100 --key-size 16 --value-size 32 \
    --batch "$batch" --in-flight 8 --duration "$DURATION" --compare-redis --json
done
"$BIN" bench kv --server-cpus 0 --client-cpus 1 --get-percent 95 --batch 16 --duration "$DURATION" --json

#!/usr/bin/env bash
# HERD's table on this machine: 16-byte keys, 32-byte values, 5% PUTs,
# batched (16 ops per frame) and non-batched clients, over tcp and shm.
# Rows with one worker pin the server to CPU 0 and the client to CPU 1;
# the two-worker row shares both CPUs between server and client (this
# machine has two), so it shows contention, not scaling.
set -euo pipefail
BIN=${BIN:-target/release/fabrickv}
DURATION=${DURATION:-5}
echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) CPUs"
for t in tcp shm; do
  "$BIN" bench herd --transport "$t" --workers 1 --server-cpus 0 --client-cpus 1 \
    --keys-per-partition 1000000 --in-flight 50 --duration "$DURATION" --json
  "$BIN" bench herd --transport "$t" --workers 2 \
    --keys-per-partition 1000000 --in-flight 50 --duration "$DURATION" --json
done

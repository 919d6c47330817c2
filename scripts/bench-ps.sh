#!/usr/bin/env bash
# PetPS's benchmark on this machine (512-byte values = 128 floats, keys
# 1..KEY_SPACE_M million, uniform): the thread x batch matrix over tcp and
# shm, the multi-client sweep (2/4/8 processes), the comparison
# (tcp pull beside Redis MGET and raw TCP of the same bytes, shm pull
# beside single-thread memcpy, all in this run), and the Python client
# beside the Rust one. Server pinned to CPU 0, clients to CPU 1.
set -euo pipefail
BIN=${BIN:-target/release/fabrickv}
DURATION=${DURATION:-5}
KEYS=${KEY_SPACE_M:-1}
ROUNDS=${ROUNDS:-3}
PIN=(--server-cpus 0 --client-cpus 1)
echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) CPUs"
echo "## matrix, tcp, 4 outstanding pulls per thread"
"$BIN" bench ps --matrix --transport tcp --key-space-m "$KEYS" --async-req 4 --duration "$DURATION" "${PIN[@]}" --json
echo "## matrix, shm, 4 outstanding pulls per thread"
"$BIN" bench ps --matrix --transport shm --key-space-m "$KEYS" --async-req 4 --duration "$DURATION" "${PIN[@]}" --json
echo "## multi-client sweep, tcp, 1 thread x batch 100 per client"
"$BIN" bench ps --clients 2,4,8 --transport tcp --key-space-m "$KEYS" --batch-read-count 100 --async-req 4 --duration "$DURATION" "${PIN[@]}" --json
echo "## targets: tcp vs Redis MGET and raw TCP, shm vs memcpy, $ROUNDS alternating rounds"
"$BIN" bench ps --compare --rounds "$ROUNDS" --key-space-m "$KEYS" --async-req 16 --duration "$DURATION" "${PIN[@]}" --json
echo "## the same, both cores for both sides: 2 server workers and 2 client threads on CPUs 0,1, client thread t on worker t on CPU t"
"$BIN" bench ps --compare --rounds "$ROUNDS" --key-space-m "$KEYS" --async-req 16 --duration "$DURATION" \
  --server-workers 2 --thread-num 2 --server-cpus 0,1 --client-cpus 0,1 --json
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import fabrickv' 2>/dev/null; then
  echo "## Python client vs Rust client (100 x 128-float pulls, one outstanding)"
  .venv/bin/python python/bench_ps.py --bin "$BIN" --duration "$DURATION"
fi

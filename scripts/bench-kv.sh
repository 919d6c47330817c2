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
# The exact peer command (redis-benchmark's default 50 clients), for reference.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c 0 redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
rpid=$!
trap 'kill $rpid 2>/dev/null' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
taskset -c 1 redis-benchmark -p "$port" -t set -d 32 -n 1000 -q >/dev/null
echo "# redis-benchmark -P 16 -d 32 -t get (default -c 50), redis-server pinned to CPU 0, load on CPU 1:"
taskset -c 1 redis-benchmark -p "$port" -P 16 -d 32 -t get -n 5000000 --csv

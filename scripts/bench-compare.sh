#!/usr/bin/env bash
# The peer comparison of the HERD issue: redis-server 7, memcached 1.6 and
# FabricKV (RESP front-end, memcache front end, native tcp, native shm),
# each server pinned to CPU 0 and its load generator to CPU 1 (memcached,
# started with -t 1, and the memcache front end meet the same generator),
# on GET/SET at pipeline depths 1, 16 and 64 and MGET of 10 and 100 keys
# (16-byte keys, 32-byte values), with server CPU-seconds per million
# operations. Called by `make compare`.
set -euo pipefail
BIN=${BIN:-target/release/fabrickv}
DURATION=${DURATION:-5}
echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) CPUs, $(redis-server --version | cut -d' ' -f1-3), $(memcached -V)"
"$BIN" bench compare --server-cpus 0 --client-cpu 1 --keys 100000 --value-size 32 \
  --depths 1,16,64 --mget 10,100 --conns 50 --duration "$DURATION" --json

#!/usr/bin/env bash
# The RPC measurement: 64-byte echo RPCs, server pinned to CPU 0,
# clients on CPU 1, a latency run (1 in flight) and a throughput run, on
# every transport this build has, with the comparison rows (raw TCP
# ping-pong, tonic gRPC unary, raw libfabric) measured in the same run;
# then each batching knob of the worker loop and the two affinities on
# their own.
set -euo pipefail
BIN=${BIN:-target/release/fabrickv}
D=${DURATION:-5}
common=(--msg-size 64 --server-cpus 0 --client-cpus 1 --duration "$D" --report-every 2 --json)
echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) CPUs"
echo "## transports"
"$BIN" bench rpc --transport tcp "${common[@]}" --compare
"$BIN" bench rpc --transport shm "${common[@]}"
if "$BIN" bench rpc --help | grep -q fabric && [ -n "$("$BIN" --version)" ] && "$BIN" bench rpc --transport fabric --provider shm --duration 0.1 --report-every 0 >/dev/null 2>&1; then
  for p in shm 'tcp;ofi_rxm'; do
    "$BIN" bench rpc --transport fabric --provider "$p" "${common[@]}" --compare
  done
else
  echo "# fabric: this build has no libfabric transport (build with --features fabric)"
fi
for t in shm tcp; do
  echo "## knobs ($t, throughput run, 32 in flight)"
  for knobs in "--poll-burst 4 --batched-send true" "--poll-burst 64 --batched-send true" "--poll-burst 64 --batched-send false" "--poll-burst 1 --batched-send false"; do
    echo "# $knobs"
    # shellcheck disable=SC2086
    "$BIN" bench rpc --transport "$t" "${common[@]}" --runs throughput $knobs
  done
done
echo "## affinity (tcp, 2 server threads, 4 client threads)"
for aff in random modulo; do
  "$BIN" bench rpc --transport tcp --msg-size 64 --server-cpus 0 --client-cpus 1 --duration "$D" --report-every 0 \
    --server-threads 2 --client-threads 4 --affinity "$aff" --runs throughput --json
done

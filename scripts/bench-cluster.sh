#!/usr/bin/env bash
# What sharding costs on this machine (`fabrickv bench cluster`): three
# one-worker servers against one two-worker server, all sharing the same
# cores, over tcp (twice) and shm. Then the runs that take the tcp ratio
# apart:
# - two one-worker servers against the two-worker server: as many frames
#   and threads on each side, so the ratio is the cluster client's own cost;
# - three one-worker servers against one three-worker server: again the
#   same frames and threads on each side (over tcp and over shm);
# - one one-worker server against the cluster: one frame per call, the
#   cheapest way to serve a call on these cores;
# - the batch size, which sets how much of a call is per-frame cost.
# Over tcp every run also prints the raw TCP split (`raw tcp A/B parts`):
# the same calls over raw sockets with no key work, the ceiling of the
# ratio on this machine.
set -euo pipefail
BIN=${BIN:-target/release/fabrickv}
ROUNDS=${ROUNDS:-5}
echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) CPUs, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
run() {
  echo "## fabrickv bench cluster $* --rounds $ROUNDS --json"
  "$BIN" bench cluster "$@" --rounds "$ROUNDS" --json
}
run --transport tcp
run --transport tcp
run --transport shm
run --transport tcp --servers 2
run --transport tcp --single-workers 3
run --transport tcp --single-workers 1
run --transport shm --single-workers 3
for b in 32 288 960; do
  run --transport tcp --batch "$b"
done

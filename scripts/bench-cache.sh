#!/usr/bin/env bash
# The KV cache's read benchmark on this machine: 64 KB values (4096 keys)
# and 1 MB values (512 keys), 4 reader threads, over tcp and over shm, each
# beside redis-server GET of the same keys, one raw TCP stream and (shm)
# single-thread memcpy, all measured in the same run, in the placements
# of `place` below.
#
# Each tcp case runs twice: one GET in flight per reader (as
# kv-bench) and DEPTH GETs in flight per reader (a batch read, as an
# inference engine fetches the blocks of a prefix; Redis pipelined as deep).
# Every case runs in both placements below.
#
# With --compare --rounds ROUNDS (default 5), FabricKV's read phase, Redis's
# and the limits take turns ROUNDS times and the targets are judged by the
# median of the rounds' ratios: on this VM one phase alone can move by 30%.
#
# There is no DURATION: every pass reads each key once, and the passes
# below give about 2-3 s of reading per case on the 2-CPU VM (tcp about
# 1.0 GB/s at 64 KB and 1.5 GB/s at 1 MB, shm 1.4 and 3.7 GB/s). Scale
# them with PASSES_SCALE (e.g. 2) on a faster or slower machine.
set -euo pipefail
BIN=${BIN:-target/release/fabrickv}
SCALE=${PASSES_SCALE:-1}
DEPTH=${DEPTH:-4}
ROUNDS=${ROUNDS:-5}
# Placements: "one" is one server worker on CPU 0 and the readers on CPU 1;
# "paired" is two workers pinned to CPUs 0 and 1 and reader t on CPU t % 2
# talking to worker t % 2, so each CPU carries half the server and half the
# readers (Redis then gets both CPUs too; the raw stream keeps its two ends
# on CPUs 0 and 1).
place() {
  case "$1" in
    one) echo "--server-cpus 0 --client-cpus 1" ;;
    paired) echo "--server-workers 2 --server-cpus 0,1 --client-cpus 0,1" ;;
  esac
}
echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) CPUs"
# transport value-size keys passes depth placement
for c in "tcp 64KB 4096 10 1 one" "tcp 64KB 4096 10 $DEPTH one" "tcp 1MB 512 8 1 one" \
  "tcp 64KB 4096 10 1 paired" "tcp 64KB 4096 10 $DEPTH paired" "tcp 1MB 512 8 1 paired" \
  "shm 64KB 4096 14 1 one" "shm 1MB 512 18 1 one" \
  "shm 64KB 4096 14 1 paired" "shm 1MB 512 18 1 paired"; do
  set -- $c
  echo "## $1, $2 values x $3 keys, 4 threads, $(( $4 * SCALE )) passes, $5 GET(s) in flight per thread, placement $6: $(place "$6")"
  # shellcheck disable=SC2046 # the placement is several flags
  "$BIN" bench cache --compare --transport "$1" --value-size "$2" --num-keys "$3" \
    --num-threads 4 --read-passes "$(( $4 * SCALE ))" --depth "$5" --rounds "$ROUNDS" $(place "$6") --json
done

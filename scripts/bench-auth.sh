#!/usr/bin/env bash
# What the cluster secret costs (`fabrickv bench auth`): a server with a
# secret beside one without, in one process, over tcp and shm. A new
# connection pays one more round trip (the challenge and its proof); GETs
# on a long-lived connection should pay nothing.
set -euo pipefail
BIN=${BIN:-target/release/fabrickv}
ROUNDS=${ROUNDS:-10}
echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) CPUs, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "## fabrickv bench auth --rounds $ROUNDS --connects 500 --gets 50000 --json"
"$BIN" bench auth --rounds "$ROUNDS" --connects 500 --gets 50000 --json

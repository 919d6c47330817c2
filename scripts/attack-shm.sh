#!/usr/bin/env bash
# The shm attacks of issue 28 (faults 1 and 2) against a real server, with
# the server's fds, RSS, CPU and liveness before and after each attack;
# each attack gets a fresh server.
# Usage: scripts/attack-shm.sh FABRICKV_BINARY ATTACK_BINARY
set -u
BIN=$1; ATTACK=$2
LOG=$(mktemp)
PID=
trap 'kill $PID 2>/dev/null; rm -f "$LOG"' EXIT
start() {
  NAME=attack-$$-$1
  "$BIN" serve --listen "shm://$NAME" --workers 2 --memory 256MB --grpc off --log-level warn >"$LOG" 2>&1 &
  PID=$!
  for _ in $(seq 100); do "$ATTACK" probe "$NAME" >/dev/null 2>&1 && break; sleep 0.1; done
}
measure() {
  echo "$1: fds=$(ls /proc/$PID/fd | wc -l) rss_kb=$(awk '/VmRSS/{print $2}' /proc/$PID/status) alive=$(kill -0 $PID 2>/dev/null && echo yes || echo no) cpu_ticks=$(awk '{print $14+$15}' /proc/$PID/stat)"
}
stop() {
  echo "panics in the server log: $(grep -c panicked "$LOG")"
  grep -m1 panicked "$LOG"
  kill $PID; wait $PID 2>/dev/null
}
start dead
measure "idle server"
timeout 300 "$ATTACK" dead "$NAME" 1 300
sleep 2
measure "2 s after 300 dead clients"
sleep 5
measure "7 s after"
stop
start flip
measure "idle server"
timeout 120 "$ATTACK" flip "$NAME" 10
measure "after 10 s of flipped SHARD GETs"
sleep 10
measure "10 s later"
stop

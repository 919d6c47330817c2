#!/usr/bin/env bash
# The shm attacks (docs/security.md) against a real server, with
# the server's fds, RSS, CPU and liveness before and after each attack;
# each attack gets a fresh server.
# Usage: [ONLY=dead|idle|resp] [IDLE_ARGS='--idle-timeout 3'] [RESP_ARGS='--resp-idle-timeout 3']
#        scripts/attack-shm.sh FABRICKV_BINARY ATTACK_BINARY
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
if [ "${ONLY:-all}" = all ] || [ "${ONLY:-all}" = dead ]; then
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
fi
# Fault 6: idle native connections at the cap (tcp: CONNECTIONS_MAX 4,096;
# shm: SHM_CONNECTIONS_MAX 256). IDLE_ARGS passes e.g. --idle-timeout 3.
for t in tcp shm; do
  [ "${ONLY:-all}" = resp ] && break
  PORT=$((20000 + $$ % 20000))
  if [ $t = tcp ]; then ADDR=tcp://127.0.0.1:$PORT; N=4200; else ADDR=shm://attack-$$-idle; N=300; fi
  "$BIN" serve --listen "$ADDR" --workers 2 --memory 256MB --grpc off --log-level warn ${IDLE_ARGS:-} >"$LOG" 2>&1 &
  PID=$!
  for _ in $(seq 100); do "$ATTACK" probe-addr "$ADDR" >/dev/null 2>&1 && break; sleep 0.1; done
  measure "$t idle server"
  timeout 300 "$ATTACK" idle "$ADDR" $N 10 &
  A=$!
  sleep 6
  measure "$t while $N idle connections are held"
  wait $A
  stop
done
# Fault 6 on RESP: RESP_CONNECTIONS_MAX (4,096) idle sockets, then a fresh
# PING each second. RESP_ARGS passes e.g. --resp-idle-timeout 3.
if [ "${ONLY:-all}" != dead ]; then
  PORT=$((20000 + $$ % 20000)); RPORT=$((PORT + 1))
  "$BIN" serve --listen "127.0.0.1:$PORT" --resp "127.0.0.1:$RPORT" --workers 2 --memory 256MB --grpc off --log-level warn ${RESP_ARGS:-} >"$LOG" 2>&1 &
  PID=$!
  for _ in $(seq 100); do "$ATTACK" probe-addr "tcp://127.0.0.1:$PORT" >/dev/null 2>&1 && break; sleep 0.1; done
  measure "resp idle server"
  timeout 300 "$ATTACK" resp-idle "127.0.0.1:$RPORT" 4200 10 &
  A=$!
  sleep 6
  measure "resp while 4200 idle sockets are held"
  wait $A
  stop
fi

#!/usr/bin/env bash
# The front-end attack run (gRPC bearer, RESP AUTH brute force,
# registry junk, gRPC squatter, empty key); see docs/security.md.
# Usage: scripts/attack-fronts.sh BIN LABEL   (BIN: a fabrickv binary). Needs
# curl with HTTP/2, redis-cli, memcached, python3. Step 4 holds [::1]:50051
# for 8 s: run it when no other server on this host needs that port.
set -u
BIN=$1; LABEL=$2
W=$(mktemp -d)
head -c 32 /dev/urandom | base64 > $W/token; chmod 600 $W/token
printf 'hunter2\n' > $W/pw; chmod 600 $W/pw
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitfor() { for i in $(seq 1 600); do grep -q "$2" $1 2>/dev/null && return 0; sleep 0.1; done; echo "timeout waiting for $2"; cat $1; return 1; }
echo "== $LABEL: $BIN"

echo "-- 1. gRPC Stats call with no token, server started with a secret"
G=$(port); N=$(port)
FABRICKV_AUTH_TOKEN_FILE=$W/token $BIN serve --listen 127.0.0.1:$N --grpc 127.0.0.1:$G --workers 1 --memory 64MB --cache-memory 64MB > $W/g.log 2>&1 &
GP=$!; waitfor $W/g.log "Ctrl-C" >/dev/null
printf '\0\0\0\0\0' > $W/empty.grpc
call() { curl -s -o /dev/null -D - --http2-prior-knowledge -H 'content-type: application/grpc' -H 'te: trailers' "$@" --data-binary @$W/empty.grpc http://127.0.0.1:$G/fabrickv.cache.v1.KvCache/Stats | tr -d '\r' | grep -E '^(grpc-status|grpc-message|fabrickv-code-name):' | tr '\n' ' '; echo; }
echo -n "no token:    "; call
echo -n "wrong token: "; call -H "authorization: Bearer wrong-token-0123456789"
echo -n "right token: "; call -H "authorization: Bearer $(cat $W/token)"
kill $GP; wait $GP 2>/dev/null

echo "-- 2. RESP brute force: wrong AUTH attempts one connection gets answered in 10 s"
R=$(port); N=$(port)
if $BIN serve --help | grep -q resp-password-file; then PWARGS=(--resp-password-file $W/pw); else PWARGS=(--resp-password hunter2); fi
$BIN serve --listen 127.0.0.1:$N --resp 127.0.0.1:$R --grpc off --workers 1 --memory 64MB "${PWARGS[@]}" > $W/r.log 2>&1 &
RP=$!; waitfor $W/r.log "Ctrl-C" >/dev/null
python3 - $R <<'PY'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); s.settimeout(30)
n = 0; t0 = time.monotonic(); buf = b""; gaps = []
while time.monotonic() - t0 < 10:
    t = time.monotonic()
    s.sendall(b"*2\r\n$4\r\nAUTH\r\n$5\r\nguess\r\n")
    while b"\r\n" not in buf: buf += s.recv(4096)
    line, buf = buf.split(b"\r\n", 1)
    assert line.startswith(b"-WRONGPASS"), line
    n += 1; gaps.append(time.monotonic() - t)
el = time.monotonic() - t0
print(f"{n} wrong AUTHs in {el:.1f} s = {n/el:.1f}/s; reply delays of the first 7 (ms): {[round(g*1000) for g in gaps[:7]]}")
o = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); o.settimeout(30)
s.sendall(b"*2\r\n$4\r\nAUTH\r\n$5\r\nguess\r\n")
t = time.monotonic(); o.sendall(b"*1\r\n$4\r\nPING\r\n"); r = o.recv(100)
print(f"another connection while the guesser is parked: {r!r} in {1000*(time.monotonic()-t):.1f} ms")
o.sendall(b"*2\r\n$4\r\nAUTH\r\n$7\r\nhunter2\r\n"); o.recv(100)
o.sendall(b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n"); time.sleep(0.2); info = o.recv(65536).decode()
print("INFO:", [l for l in info.split("\r\n") if "acl" in l] or "no acl_access_denied_auth line")
PY
kill $RP; wait $RP 2>/dev/null

echo "-- 3. registry with one junk entry beside a live server"
M=$(port); N=$(port)
memcached -u nobody -l 127.0.0.1 -p $M > /dev/null 2>&1 &
MP=$!; sleep 0.5
$BIN serve --listen 127.0.0.1:$N --grpc off --workers 1 --memory 64MB --registry memcached://127.0.0.1:$M --cluster atk --id 0 --cluster-size 2 > $W/c.log 2>&1 &
CP=$!; waitfor $W/c.log "Ctrl-C" >/dev/null
printf 'set fabrickv/atk/server/1 0 60 8\r\n\xff\xfejunk!!\r\nquit\r\n' | timeout 5 nc -q1 127.0.0.1 $M >/dev/null 2>&1 || python3 -c "
import socket;s=socket.create_connection(('127.0.0.1',$M));s.sendall(b'set fabrickv/atk/server/1 0 60 8\r\n\xff\xfejunk!!\r\n');print(s.recv(100))" >/dev/null
timeout 20 $BIN cluster show --registry memcached://127.0.0.1:$M --cluster atk --wait 1 > $W/show.out 2>&1; echo "cluster show exit $?: $(head -c 300 $W/show.out | tr '\n' ' ')"
timeout 20 $BIN put k v --registry memcached://127.0.0.1:$M --cluster atk > $W/put.out 2>&1; echo "put via registry exit $?: $(head -c 200 $W/put.out | tr '\n' ' ')"
kill $CP; wait $CP 2>/dev/null; kill $MP; wait $MP 2>/dev/null

echo "-- 4. gRPC squatter holds the default address [::1]:50051"
N=$(port)
python3 -c "
import socket,time
s=socket.socket(socket.AF_INET6);s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('::1',50051));s.listen(1);time.sleep(8)" &
SQ=$!; sleep 0.5
timeout 6 $BIN serve --listen 127.0.0.1:$N --workers 1 --memory 64MB > $W/s.log 2>&1 &
SP=$!; sleep 4
if kill -0 $SP 2>/dev/null; then echo "serve STARTED beside the squatter: $(grep -i 'grpc' $W/s.log | head -2 | tr '\n' ' ')"; kill $SP; else wait $SP; echo "serve exited $?: $(tail -1 $W/s.log)"; fi
wait $SP 2>/dev/null; kill $SQ 2>/dev/null; wait $SQ 2>/dev/null

echo "-- 5. empty key over RESP and natively"
R=$(port); N=$(port)
$BIN serve --listen 127.0.0.1:$N --resp 127.0.0.1:$R --grpc off --workers 1 --memory 64MB > $W/e.log 2>&1 &
EP=$!; waitfor $W/e.log "Ctrl-C" >/dev/null
echo "RESP SET '' v: $(redis-cli -p $R set '' v)"
echo "RESP GET '':   $(redis-cli -p $R get '')"
echo "native get '': $($BIN get '' --server 127.0.0.1:$N 2>&1 | head -1)"
kill $EP; wait $EP 2>/dev/null
rm -rf $W

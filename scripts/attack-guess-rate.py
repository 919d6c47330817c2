#!/usr/bin/env python3
"""How fast an outsider can guess the cluster secret, per front end: many
parallel connections from one address, each making one wrong attempt on a
fresh connection (which escapes any per-connection delay), for a few
seconds. Counts the attempts the server judged (answered "wrong") and those
it refused unjudged (AUTH_THROTTLED); the judged ones a second are the
guess rate. An outside attack run measured 2,856 RESP AUTH guesses/s, 2,258 native
handshake proofs/s and 1,407 gRPC tokens/s before the failure throttle.

Usage: scripts/attack-guess-rate.py --bin PATH [--seconds 5] [--threads 50]
"""

import argparse
import os
import re
import socket
import subprocess
import tempfile
import threading
import time

START_TIMEOUT_S = 30.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary, token, grpc_port, resp_port):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICKV_")}
    p = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--workers", "1", "--memory", "64MB",
         "--cache-memory", "64MB", "--grpc", f"127.0.0.1:{grpc_port}",
         "--resp", f"127.0.0.1:{resp_port}", "--log-level", "error",
         "--auth-token-file", token],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        m = re.search(r"serving on (\S+?)[, ]", line + " ")
        if m:
            threading.Thread(target=p.stderr.read, daemon=True).start()
            return p, m.group(1)
    p.kill()
    raise SystemExit("the server did not start")


def read_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("closed")
        b += c
    return b


def native_once(host, port):
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"FKV\x01\0\0\0\0")
        head = read_exact(s, 8)
        if head[:3] == b"FKC":
            read_exact(s, 32)
            s.sendall(os.urandom(32))
            head = read_exact(s, 8)
        code = int.from_bytes(head[4:6], "little")
        return {33: "judged", 39: "throttled"}.get(code, f"code {code}")


def resp_once(host, port):
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"*2\r\n$4\r\nAUTH\r\n$24\r\n" + os.urandom(12).hex().encode() + b"\r\n")
        line = b""
        while not line.endswith(b"\r\n"):
            c = s.recv(256)
            if not c:
                break
            line += c
        if line.startswith(b"-WRONGPASS"):
            return "judged"
        if line.startswith(b"-AUTH_THROTTLED"):
            return "throttled"
        return line.decode(errors="replace").strip()


def hammer(name, once, seconds, threads):
    counts = {}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def loop():
        while time.monotonic() < stop:
            try:
                r = once()
            except OSError as e:
                r = f"error {e.__class__.__name__}"
            with lock:
                counts[r] = counts.get(r, 0) + 1

    ts = [threading.Thread(target=loop) for _ in range(threads)]
    start = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.monotonic() - start
    judged = counts.get("judged", 0)
    print(f"| {name} | {threads} | {took:.1f} | {judged} | {judged / took:,.1f} | "
          f"{counts.get('throttled', 0)} | {dict(sorted(counts.items()))} |")


def grpc_burst(port, calls, tmp):
    """`calls` gRPC Stats calls with a wrong bearer token, 100 at a time
    over HTTP/2 (curl), as one guesser multiplexing on its connections."""
    body = os.path.join(tmp, "empty.grpc")
    with open(body, "wb") as f:
        f.write(b"\0\0\0\0\0")
    cfg = os.path.join(tmp, "curl.cfg")
    with open(cfg, "w") as f:
        for i in range(calls):
            f.write(f'url = "http://127.0.0.1:{port}/fabrickv.cache.v1.KvCache/Stats"\n')
            f.write(f'header = "authorization: Bearer wrong-token-{i:012d}"\n')
            # Per-transfer options: each call's headers to stdout.
            f.write('output = "/dev/null"\ndump-header = "-"\nnext\n')
    start = time.monotonic()
    out = subprocess.run(
        ["curl", "-s", "-Z", "--parallel-max", "100", "--http2-prior-knowledge",
         "-H", "content-type: application/grpc",
         "-H", "te: trailers", "--data-binary", f"@{body}", "-K", cfg],
        capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    names = re.findall(r"fabrickv-code-name: (\S+)", out.stdout)
    judged = names.count("AUTH_FAILED")
    throttled = names.count("AUTH_THROTTLED")
    print(f"| gRPC wrong bearer token | 100 streams | {took:.1f} | {judged} | "
          f"{judged / took:,.1f} | {throttled} | {calls} calls |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=50)
    ap.add_argument("--grpc-calls", type=int, default=5000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        token = os.path.join(tmp, "token")
        with open(token, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        os.chmod(token, 0o600)
        print("| front end | parallel | seconds | judged | judged/s | throttled | replies |")
        print("|---|---|---|---|---|---|---|")
        # A fresh server per front end, so that one's failures do not
        # throttle the next (they share one count per server).
        for name in ("native handshake (tcp)", "RESP AUTH", "gRPC"):
            grpc, resp = free_port(), free_port()
            p, addr = serve(a.bin, token, grpc, resp)
            host, port = addr.split("://")[-1].rsplit(":", 1)
            try:
                if name.startswith("native"):
                    hammer(name, lambda: native_once(host, int(port)), a.seconds, a.threads)
                elif name.startswith("RESP"):
                    hammer(name, lambda: resp_once("127.0.0.1", resp), a.seconds, a.threads)
                else:
                    grpc_burst(grpc, a.grpc_calls, tmp)
            finally:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()

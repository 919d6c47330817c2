#!/usr/bin/env python3
"""An attack run against the native protocol's authentication, as an
outsider who reaches the port but lacks the secret would try it: the same
server without a secret (as every server was before the cluster secret) and with
one, side by side. Prints one markdown row per measurement.

- a PS CREATE from the outsider (which builds, zeroes and mlocks the
  whole embedding pool): exit code and the server's RSS before and after;
- GUESSES raw tcp connections that send an opening and a random 32-byte
  proof: how many got in, and the server's open descriptors before and
  after (nothing may be left behind);
- an shm client run as another user (uid 65534; root only).

Usage: scripts/attack-auth.py [--bin target/release/fabrickv] [--guesses N]
"""

import argparse
import os
import re
import socket
import struct
import subprocess
import tempfile
import time

START_TIMEOUT_S = 20.0
NOBODY = 65534


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def serve(binary, listen, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICKV_AUTH")}
    p = subprocess.Popen(
        [binary, "serve", "--listen", listen, "--workers", "1", "--memory", "64MB",
         "--grpc", "off", "--dram-pool-gb", "1", "--log-level", "error", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        m = re.search(r"serving on (\S+?)[, ]", line + " ")
        if m:
            return p, m.group(1)
    p.kill()
    raise SystemExit(f"the server did not start: {p.stderr.read()}")


def outsider(binary, args, uid=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICKV_AUTH")}
    kw = {"user": uid, "group": uid} if uid is not None else {}
    return subprocess.run([binary, *args], capture_output=True, text=True, env=env, **kw)


def guess(host, port):
    """One connection with a random proof; True if the server let it in."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"FKV\x01" + struct.pack("<HH", 0, 0))
        head = s.recv(8, socket.MSG_WAITALL)
        if head[:3] == b"FKC":
            s.recv(32, socket.MSG_WAITALL)
            s.sendall(os.urandom(32))
            head = s.recv(8, socket.MSG_WAITALL)
        status = struct.unpack("<H", head[4:6])[0]
        return status == 0


def run(binary, guesses, token):
    rows = []
    for name, extra in (("no secret (before)", []), ("secret (after)", ["--auth-token-file", token])):
        p, addr = serve(binary, "127.0.0.1:0", extra)
        host, port = addr.removeprefix("tcp://").rsplit(":", 1)
        rss0, fd0 = rss_kib(p.pid), fds(p.pid)
        c = outsider(binary, ["ps", "create", "t:64", "--server", addr])
        rss1 = rss_kib(p.pid)
        t = time.monotonic()
        admitted = sum(guess(host, int(port)) for _ in range(guesses))
        rate = guesses / (time.monotonic() - t)
        time.sleep(0.5)  # let the worker close what the guessers left
        fd1 = fds(p.pid)
        err = (c.stderr.strip().splitlines() or [""])[-1][:90]
        rows.append(f"| {name} | ps create exit {c.returncode} `{err}` | "
                    f"RSS {rss0 // 1024} -> {rss1 // 1024} MiB | {admitted}/{guesses} random proofs admitted "
                    f"({rate:.0f}/s) | fds {fd0} -> {fd1} |")
        p.terminate()
        p.wait()
    if os.geteuid() == 0:
        for name, extra in (("shm, own user only", []), ("shm, --shm-allow-uid 65534", ["--shm-allow-uid", str(NOBODY)])):
            p, addr = serve(binary, f"shm://attack-auth-{os.getpid()}-{len(rows)}", extra)
            c = outsider(binary, ["put", "k", "v", "--server", addr], uid=NOBODY)
            err = (c.stderr.strip().splitlines() or ["ok"])[-1][:90]
            rows.append(f"| {name} | put as uid {NOBODY}: exit {c.returncode} `{err}` | | | |")
            p.terminate()
            p.wait()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/fabrickv")
    ap.add_argument("--guesses", type=int, default=2000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        token = os.path.join(d, "token")
        with open(token, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        os.chmod(token, 0o600)
        print("| server | outsider's PS CREATE | server RSS | guessing | server fds |")
        print("|---|---|---|---|---|")
        for r in run(a.bin, a.guesses, token):
            print(r)


if __name__ == "__main__":
    main()

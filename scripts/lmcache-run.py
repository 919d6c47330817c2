#!/usr/bin/env python3
"""An LMCache-style run against FabricKV's RESP front end with redis-py:
N chunks of 16 MiB under `prefix:{hash}:kv_bytes` beside small `:metadata`
keys, SET one after another as LMCache's Redis connector does, then EXISTS
of every key and GET of every chunk still held, each byte checked.

By default it starts its own server (`--bin`, cache mode, 4 GB for large
values over two workers): 1,000 x 16 MiB is 16 GiB, so the cache evicts
the oldest chunks (FIFO) as LMCache expects of a cache, and the GETs read
the chunks still held. `--port` runs against a server already up instead.

    python3 scripts/lmcache-run.py --bin target/release/fabrickv
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import redis

MIB = 1 << 20


def start_server(binary, mode, large_memory, workers):
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--resp", "127.0.0.1:0",
         "--workers", str(workers), "--mode", mode, "--memory", "256MB",
         "--large-memory", large_memory, "--log-level", "warn", "--grpc", "off"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pattern = re.compile(r"RESP on (\S+):(\d+)")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = pattern.search(line)
        if m:
            return proc, m.group(1), int(m.group(2))
    proc.kill()
    sys.exit("the server did not print its RESP address")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/fabrickv")
    ap.add_argument("--port", type=int, help="use a server already on this port")
    ap.add_argument("--chunks", type=int, default=1000)
    ap.add_argument("--chunk-mb", type=int, default=16)
    ap.add_argument("--mode", default="cache")
    ap.add_argument("--large-memory", default="4GB")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()

    proc = None
    host, port = "127.0.0.1", a.port
    if port is None:
        proc, host, port = start_server(a.bin, a.mode, a.large_memory, a.workers)
    r = redis.Redis(host=host, port=port, socket_timeout=120)
    size = a.chunk_mb * MIB
    base = os.urandom(size)

    def chunk(i):
        k = (i * 4099) % size
        return base[k:] + base[:k]

    keys = [f"vllm@model@1@0:{hashlib.sha256(str(i).encode()).hexdigest()[:16]}"
            for i in range(a.chunks)]
    t = time.monotonic()
    for i, key in enumerate(keys):
        r.set(f"{key}:metadata", json.dumps({"chunk": i, "dtype": "bfloat16"}))
        r.set(f"{key}:kv_bytes", chunk(i))
    set_s = time.monotonic() - t

    t = time.monotonic()
    held = [i for i, key in enumerate(keys) if r.exists(f"{key}:kv_bytes")]
    exists_s = time.monotonic() - t

    # LMCache lists what a server holds with SCAN MATCH: every chunk held
    # (present for the whole scan) must come back.
    t = time.monotonic()
    scanned = set(k.decode() for k in r.scan_iter(match="vllm@model@1@0:*:kv_bytes", count=1000))
    scan_s = time.monotonic() - t
    missing = sum(1 for i in held if f"{keys[i]}:kv_bytes" not in scanned)

    t = time.monotonic()
    wrong = 0
    for i in held:
        got = r.get(f"{keys[i]}:kv_bytes")
        if got is None:
            continue
        if got != chunk(i):
            wrong += 1
    get_s = time.monotonic() - t

    info = r.info("memory")
    stats = r.info("stats")
    gib = a.chunks * size / (1 << 30)
    where = (f"mode {a.mode}, large-memory {a.large_memory}, workers {a.workers}"
             if proc is not None else f"the server on port {port}")
    print(f"chunks: {a.chunks} x {a.chunk_mb} MiB = {gib:.1f} GiB, {where}")
    print(f"SET    : {a.chunks} chunks in {set_s:.2f} s = "
          f"{a.chunks * size / set_s / 1e9:.2f} GB/s ({a.chunks / set_s:.1f} chunks/s)")
    print(f"EXISTS : {a.chunks} keys in {exists_s:.3f} s; {len(held)} chunks held, "
          f"{stats.get('evicted_keys', 0)} evicted")
    print(f"SCAN   : MATCH *:kv_bytes in {scan_s:.3f} s returned {len(scanned)} keys; "
          f"{missing} held chunks missing")
    print(f"GET    : {len(held)} chunks in {get_s:.2f} s = "
          f"{len(held) * size / get_s / 1e9:.2f} GB/s, every byte checked, "
          f"{wrong} wrong")
    if "large_values" in info:
        print(f"server : large_values={info['large_values']} "
              f"large_values_bytes={info['large_values_bytes']} "
              f"large_values_maxbytes={info['large_values_maxbytes']} "
              f"large_receiving_bytes={info['large_receiving_bytes']}")
    else:
        # Another server (redis-server, --port): its own memory line.
        print(f"server : used_memory={info.get('used_memory')} "
              f"maxmemory={info.get('maxmemory')}")
    print(json.dumps({"bench": "lmcache-run", "chunks": a.chunks,
                      "chunk_bytes": size, "mode": a.mode,
                      "set_gb_per_s": a.chunks * size / set_s / 1e9,
                      "get_gb_per_s": len(held) * size / get_s / 1e9 if get_s else 0,
                      "held": len(held), "scan_missing": missing, "wrong": wrong}))
    r.close()
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)
    return 1 if wrong or missing else 0


if __name__ == "__main__":
    sys.exit(main())

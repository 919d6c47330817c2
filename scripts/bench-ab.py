#!/usr/bin/env python3
"""A/B of two `fabrickv` binaries on the benchmarks, alternating A B A B.

A change that should not move performance (a refactor) is checked by
running each benchmark with the old binary (A) and the new one (B) in
turn, ROUNDS times each, on the same machine in the same minutes, and
comparing medians. The spread between runs of the same binary is the
noise a difference must exceed to mean anything; both are printed.

Every benchmark prints one JSON line per result (`--json`); a result is
keyed by its `bench`, `case` and `system` fields, and its figure is the
first of `ops_per_s`, `mkv_s`, `bytes_per_s`, `keys_per_s`, `mb_per_s`,
`copy_mb_per_s` it has. FabricKV's rate against the peer measured in the
same run (Redis, raw TCP, memcpy) is what the benchmarks report; this
script reports B over A for each figure, peers included, so a peer that
moved between runs shows as noise too.

Usage: scripts/bench-ab.py A_BIN B_BIN [--rounds N] [--only NAME,...] [--out FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Each benchmark at a size that takes seconds, not minutes: enough for a
# ratio within a few percent on a quiet machine.
BENCHES = {
    "kv": "bench kv --duration 2 --keys 100000 --get-percent 100 --batch 16 --server-cpus 0 --client-cpus 1 --json",
    "herd-tcp": "bench herd --workers 1 --keys-per-partition 200000 --duration 2 --server-cpus 0 --client-cpus 1 --json",
    "herd-shm": "bench herd --transport shm --workers 1 --keys-per-partition 200000 --duration 2 --server-cpus 0 --client-cpus 1 --json",
    "ps": "bench ps --compare --key-space-m 0.2 --async-req 16 --duration 2 --server-cpus 0 --client-cpus 1 --json",
    "cache": "bench cache --num-keys 1024 --value-size 64KB --num-threads 2 --warmup 100 --compare --server-cpus 0 --client-cpus 1 --json",
    "rpc-tcp": "bench rpc --transport tcp --duration 2 --report-every 0 --server-cpus 0 --client-cpus 1 --compare --json",
    "rpc-shm": "bench rpc --transport shm --duration 2 --report-every 0 --server-cpus 0 --client-cpus 1 --compare --json",
    "cluster": "bench cluster --rounds 2 --duration 1 --json",
    # The RESP and memcache front ends' GET/SET/MGET paths beside their
    # peers (every system bench compare runs, at two pipeline depths).
    "compare": "bench compare --keys 20000 --duration 1 --depths 1,16 --mget 10 --paced-rate -1 --json",
    "copy": "bench copy --size 256MB --value-size 256 --dir {tmp} --clean",
}
FIGURES = ("ops_per_s", "mkv_s", "bytes_per_s", "keys_per_s", "copy_mb_per_s", "mb_per_s", "responses_per_s")


def results(out):
    """{key: figure} of the JSON lines in a benchmark's output."""
    got = {}
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        fig = next((f for f in FIGURES if isinstance(r.get(f), (int, float))), None)
        if fig is None:
            continue
        key = " / ".join(str(r[k]) for k in ("bench", "case", "system") if k in r) + f" [{fig}]"
        n = 2
        base = key
        while key in got:
            key = f"{base} #{n}"
            n += 1
        got[key] = float(r[fig])
    return got


def run(binary, cmd):
    with tempfile.TemporaryDirectory(prefix="fkv-ab-") as tmp:
        argv = [binary] + cmd.format(tmp=tmp).split()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return results(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--out")
    args = ap.parse_args()
    names = [n for n in BENCHES if not args.only or n in args.only.split(",")]
    out = open(args.out, "a") if args.out else None
    for name in names:
        runs = {"A": [], "B": []}
        for _ in range(args.rounds):
            for side, binary in (("A", args.a), ("B", args.b)):
                t = time.monotonic()
                runs[side].append(run(binary, BENCHES[name]))
                print(f"# {name} {side} {time.monotonic() - t:.0f}s", file=sys.stderr)
        print(f"\n## {name}: {BENCHES[name]}")
        print(f"{'result':78} {'A median':>12} {'B median':>12} {'B/A':>6} {'A noise':>8} {'B noise':>8}")
        for key in runs["A"][0]:
            a = [r[key] for r in runs["A"] if key in r]
            b = [r[key] for r in runs["B"] if key in r]
            if not a or not b or min(a) <= 0:
                continue
            am, bm = statistics.median(a), statistics.median(b)
            an = max(a) / min(a) - 1
            bn = max(b) / min(b) - 1 if min(b) > 0 else float("nan")
            print(f"{key[:78]:78} {am:12.4g} {bm:12.4g} {bm / am:6.3f} {an:8.1%} {bn:8.1%}")
            if out:
                out.write(json.dumps({"bench": "ab", "name": name, "result": key, "a": a, "b": b,
                                      "b_over_a": bm / am, "a_noise": an, "b_noise": bn}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

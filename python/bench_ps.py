"""The issue's Python target: a Python pull of 100 x 128-float vectors
reaches at least 80% of the Rust client's keys/s.

Starts `fabrickv serve` (one worker on loopback, pinned to CPU 0 when
`taskset` exists, with a small lazily backed embedding pool), runs the Rust
client's benchmark on CPU 1 (`fabrickv bench ps`, which loads table
"bench" with keys 1..=100000 and pulls 100 uniformly random keys at a
time, one pull outstanding), then pulls the same way from Python, pinned
to CPU 1 too, and compares the keys per second. With `--rounds N` the two
alternate N times and the medians are compared, so that a burst of noise
from other work on the machine lands on both clients alike.

Usage: python bench_ps.py [--bin target/release/fabrickv] [--duration 5]
                          [--transport tcp|shm] [--rounds 3]

Prints a markdown table and one JSON line
{"bench":"ps.python","rust_mkv_s":..,"python_mkv_s":..,"ratio":..,"target":0.8,"met":..}.
Exits 0 whether or not the target is met (it is a measurement); nonzero
only when something fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

import fabrickv

ROOT = Path(__file__).resolve().parents[1]

# The shape: 100 keys per pull, 128 float32 (512 bytes) each, out
# of 100,000 keys.
BATCH_KEYS = 100
VALUE_BYTES = 512
DIM = VALUE_BYTES // 4
KEY_SPACE = 100_000
TABLE = "bench"

# The Python figure must reach this share of the Rust client's.
TARGET_RATIO = 0.8

# Pre-generated key arrays the Python loop cycles through, so that making
# keys is not timed (and the cycle is long enough not to be cached better
# than the Rust client's fresh keys).
KEY_ARRAYS = 4096

SERVER_CPU = 0
CLIENT_CPU = 1

# A small embedding pool, backed lazily: 100,000 x 512 B fit, and the
# server starts at once without locked memory.
PS_POOL_ARGS = ["--dram-pool-gb", "0.0625", "--dram-skip-mlock",
                "--dram-skip-memset", "--dram-skip-populate"]

START_TIMEOUT_S = 20.0


class Server:
    """A `fabrickv serve` child process; `native` is the address it printed."""

    def __init__(self, binary: Path, transport: str) -> None:
        if transport == "tcp":
            listen = "127.0.0.1:0"
        elif transport == "shm":
            listen = f"shm://fkv-benchps-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        else:
            raise SystemExit(f"unknown transport {transport!r} (tcp, shm)")
        cmd = [str(binary), "serve", "--listen", listen, "--workers", "1", "--grpc", "off",
               "--log-level", "warn", *PS_POOL_ARGS]
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", str(SERVER_CPU), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.native = self._address()

    def _address(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.stderr is not None  # opened with stderr=PIPE
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"serving on (\S+)", line)
            if m:
                return m.group(1)
        self.stop()
        raise RuntimeError("fabrickv serve did not print its address")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def rust_mkv_s(binary: Path, addr: str, duration: float, load: bool) -> float:
    """The Rust client's keys/s (millions), from its "run" JSON line; with
    `load`, it loads the table first."""
    cmd = [str(binary), "bench", "ps", "--server", addr, "--thread-num", "1",
           "--batch-read-count", str(BATCH_KEYS), "--value-size", str(VALUE_BYTES),
           "--async-req", "1", "--key-space-m", str(KEY_SPACE / 1e6),
           "--duration", str(duration), "--verify", "none", "--json",
           "--client-cpus", str(CLIENT_CPU)]
    if not load:
        cmd.append("--no-load")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                           f"{proc.stdout}{proc.stderr}")
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("case") == "run":
                return float(row["mkv_s"])
    raise RuntimeError(f"no \"case\":\"run\" line from {' '.join(cmd)}:\n{proc.stdout}")


def python_mkv_s(addr: str, duration: float) -> float:
    """Keys/s (millions) of `Table.pull` of 100 random keys, one at a time,
    for `duration` seconds."""
    if hasattr(os, "sched_setaffinity") and CLIENT_CPU < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {CLIENT_CPU})
    rng = np.random.default_rng(1)
    batches = [rng.integers(1, KEY_SPACE, size=BATCH_KEYS, endpoint=True, dtype=np.uint64)
               for _ in range(KEY_ARRAYS)]
    with fabrickv.Client(addr) as client:
        table = client.table(TABLE)
        if table.dim != DIM:
            raise RuntimeError(f"table {TABLE!r} has dim {table.dim}, not {DIM}")
        # Warm up: connect, fault in the receive path.
        for keys in batches[:100]:
            got = table.pull(keys)
        if got.shape != (BATCH_KEYS, DIM):
            raise RuntimeError(f"pull returned shape {got.shape}")
        pulls = 0
        pull = table.pull
        start = time.perf_counter()
        end = start + duration
        now = start
        while now < end:
            # Check the clock every 64 pulls, so that reading it costs little.
            for i in range(64):
                pull(batches[(pulls + i) % KEY_ARRAYS])
            pulls += 64
            now = time.perf_counter()
        return pulls * BATCH_KEYS / (now - start) / 1e6


def fmt_runs(xs: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "fabrickv"),
                    help="the fabrickv binary (make build)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per client")
    ap.add_argument("--transport", default="tcp", choices=("tcp", "shm"))
    ap.add_argument("--rounds", type=int, default=3,
                    help="Rust and Python runs, alternating; medians compared")
    args = ap.parse_args()
    binary = Path(args.bin)
    if not binary.exists():
        print(f"{binary} is missing: run `make build`", file=sys.stderr)
        return 2
    if not args.duration > 0 or args.rounds < 1:
        print("--duration must be positive and --rounds at least 1", file=sys.stderr)
        return 2

    rust_runs: list[float] = []
    python_runs: list[float] = []
    server = Server(binary, args.transport)
    try:
        for r in range(args.rounds):
            rust_runs.append(rust_mkv_s(binary, server.native, args.duration, load=r == 0))
            python_runs.append(python_mkv_s(server.native, args.duration))
    finally:
        server.stop()

    rust = statistics.median(rust_runs)
    python = statistics.median(python_runs)
    ratio = python / rust if rust > 0 else 0.0
    met = ratio >= TARGET_RATIO
    print(f"Pull of {BATCH_KEYS} x {DIM}-float vectors over {args.transport}, one "
          f"outstanding, median of {args.rounds} x {args.duration:g} s per client:\n")
    print("| client | Mkv/s | runs | ratio |")
    print("|---|---:|---|---:|")
    print(f"| Rust (fabrickv bench ps) | {rust:.3f} | {fmt_runs(rust_runs)} | 1.00 |")
    print(f"| Python (Table.pull) | {python:.3f} | {fmt_runs(python_runs)} | {ratio:.2f} |")
    print()
    print(json.dumps({"bench": "ps.python", "transport": args.transport,
                      "rust_mkv_s": round(rust, 4), "python_mkv_s": round(python, 4),
                      "ratio": round(ratio, 4), "target": TARGET_RATIO, "met": met,
                      "rounds": args.rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

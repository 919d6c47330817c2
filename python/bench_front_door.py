"""The Python front door's targets (fast paths in and out of Python
buffers, asyncio, batched cache calls, the wheel), each measured against
its baseline in the same run:

- pull_out: `Table.pull(keys, out=buf)` of 100 x 128-float vectors into
  one preallocated array, keys/s against the Rust client's (`fabrickv
  bench ps`, same shape, same server); target >= 0.95.
- async_pull: `AsyncTable.pull(out=)` with 16 pulls in flight from one
  event loop, keys/s against blocking pulls one after another on one
  `Client`; target >= 0.9.
- exists_many: `CacheClient.exists_many` of 1,000 keys against 1,000
  `exists` calls; target >= 20 (times faster).
- get_many_into: 64 blocks of 256 KiB over shm into one buffer from
  `CacheClient.register_buffer` (the server writes each block in place,
  nothing is copied in this process), bytes/s against numpy's copy of the
  same 16 MiB between two warm buffers (memcpy); target >= 0.8.
- get_many_into_any: the same into an ordinary numpy array (each block
  lands in the client's receive buffer and is copied out), against the
  same memcpy; reported beside it, held to the same 0.8.
- wheel: `pip install dist/fabrickv-*.whl` plus `import fabrickv` in a
  fresh venv, seconds; target < 10 (only when dist/ holds a wheel).

The server runs on CPU 0 and this process on CPU 1 where `taskset`
exists (as python/bench_ps.py does); with `--rounds N` the measured and
the baseline alternate N times (pull_out swaps which goes first every
round, so a drift of the machine's speed falls on both alike, after a
round that is not counted, in which the table is loaded), and the
ratio reported is the median of the N per-round ratios, which a noisy
round moves less than a ratio of two medians. numpy's BLAS threads are
held to one (`OPENBLAS_NUM_THREADS`), so that no idle BLAS thread spins
on the client's CPU.

Usage: python bench_front_door.py [--bin target/release/fabrickv]
                                  [--duration 2] [--rounds 3] [--only NAME,...]

Prints a markdown table and one JSON line per result
{"bench":"front_door.NAME","value":..,"baseline":..,"ratio":..,"target":..,"met":..}.
Exits 0 whether or not a target is met (it is a measurement); nonzero only
when something fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

# Before numpy loads: its BLAS threads would spin on the client's CPU.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import fabrickv  # noqa: E402
from bench_ps import (BATCH_KEYS, CLIENT_CPU, DIM, KEY_ARRAYS, KEY_SPACE, ROOT, TABLE, Server,
                      rust_mkv_s)

# Pulls in flight in the asyncio measurement, and its client's workers.
ASYNC_IN_FLIGHT = 16
ASYNC_WORKERS = 4

# exists_many's batch, and the share of its keys that are stored.
EXISTS_KEYS = 1000

# get_many_into's batch: 64 blocks of 256 KiB (16 MiB).
BLOCKS = 64
BLOCK_BYTES = 256 << 10

# Seconds of the uncounted round before pull_out's and async_pull's
# rounds (the table's load and both clients' warm-up): long enough that
# the first counted round no longer runs slower than the rest.
WARM_UP_S = 0.5

TARGETS = {"pull_out": 0.95, "async_pull": 0.9, "exists_many": 20.0,
           "get_many_into": 0.8, "get_many_into_any": 0.8, "wheel": 10.0}


def pin_client() -> None:
    if hasattr(os, "sched_setaffinity") and CLIENT_CPU < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {CLIENT_CPU})


def key_batches() -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(1)
    return [rng.integers(1, KEY_SPACE, size=BATCH_KEYS, endpoint=True, dtype=np.uint64)
            for _ in range(KEY_ARRAYS)]


def timed_loop(step: Callable[[int], object], duration: float, per_check: int = 64) -> float:
    """Runs `step(i)` for `duration` seconds; calls per second."""
    n = 0
    start = time.perf_counter()
    end = start + duration
    now = start
    while now < end:
        for i in range(per_check):
            step(n + i)
        n += per_check
        now = time.perf_counter()
    return n / (now - start)


def python_pull_out_mkv_s(addr: str, duration: float) -> float:
    batches = key_batches()
    out = np.empty((BATCH_KEYS, DIM), np.float32)
    with fabrickv.Client(addr) as client:
        table = client.table(TABLE)
        pull = table.pull
        for keys in batches[:100]:
            pull(keys, out=out)
        rate = timed_loop(lambda i: pull(batches[i % KEY_ARRAYS], out=out), duration)
    return rate * BATCH_KEYS / 1e6


def async_pull_mkv_s(addr: str, duration: float) -> float:
    batches = key_batches()

    async def main() -> float:
        async with fabrickv.AsyncClient(addr, workers=ASYNC_WORKERS) as client:
            table = await client.table(TABLE)
            outs = [np.empty((BATCH_KEYS, DIM), np.float32) for _ in range(ASYNC_IN_FLIGHT)]
            done = 0
            stop_at = 0.0

            async def lane(j: int) -> None:
                nonlocal done
                i = j
                while time.perf_counter() < stop_at:
                    await table.pull(batches[i % KEY_ARRAYS], out=outs[j])
                    i += ASYNC_IN_FLIGHT
                    done += 1

            stop_at = time.perf_counter() + 0.2
            await asyncio.gather(*(lane(j) for j in range(ASYNC_IN_FLIGHT)))
            done = 0
            start = time.perf_counter()
            stop_at = start + duration
            await asyncio.gather(*(lane(j) for j in range(ASYNC_IN_FLIGHT)))
            return done * BATCH_KEYS / (time.perf_counter() - start) / 1e6

    return asyncio.run(main())


def exists_rates(addr: str, duration: float) -> tuple[float, float]:
    """(exists_many batches/s, batches of 1,000 single exists per s)."""
    prefix = uuid.uuid4().hex[:8]
    keys = [f"fd-{prefix}-{i}".encode() for i in range(EXISTS_KEYS)]
    with fabrickv.CacheClient(addr, buffer_mb=1) as c:
        for k in keys[::2]:
            c.put(k, b"v")
        want = [i % 2 == 0 for i in range(EXISTS_KEYS)]
        if c.exists_many(keys) != want:
            raise RuntimeError("exists_many answered wrong")
        many = timed_loop(lambda i: c.exists_many(keys), duration, per_check=4)
        exists = c.exists

        def singles(_: int) -> None:
            for k in keys:
                exists(k)

        single = timed_loop(singles, duration, per_check=1)
    return many, single


def get_many_rates(addr: str, duration: float) -> tuple[float, ...]:
    """(get_many_into GB/s into registered memory, the same into an
    ordinary array, numpy copy GB/s) over the same 16 MiB."""
    prefix = uuid.uuid4().hex[:8]
    keys = [f"fdb-{prefix}-{i}".encode() for i in range(BLOCKS)]
    src = np.random.default_rng(2).integers(0, 256, (BLOCKS, BLOCK_BYTES), dtype=np.uint8)
    dst = np.empty_like(src)
    offsets = [i * BLOCK_BYTES for i in range(BLOCKS)]
    total = src.nbytes
    rates = []
    with fabrickv.CacheClient(addr, buffer_mb=2 * total >> 20) as c:
        c.put_many_from(keys, list(src))
        for flat in (c.register_buffer(total), dst.reshape(-1)):
            flat[:] = 0
            c.get_many_into(keys, flat, offsets=offsets, sizes=BLOCK_BYTES)
            if not np.array_equal(flat.reshape(src.shape), src):
                raise RuntimeError("get_many_into returned other bytes")
            into = flat
            got = timed_loop(lambda i: c.get_many_into(keys, into, offsets=offsets,
                                                       sizes=BLOCK_BYTES),
                             duration, per_check=2)
            rates.append(got * total / 1e9)
    copy = timed_loop(lambda i: np.copyto(dst, src), duration, per_check=4)
    return rates[0], rates[1], copy * total / 1e9


def wheel_seconds() -> float | None:
    wheels = sorted((ROOT / "dist").glob("fabrickv-*.whl"))
    if len(wheels) != 1:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = venv / "bin" / "python"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO", "RUSTUP"))}
        env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
        env.pop("VIRTUAL_ENV", None)
        start = time.monotonic()
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--only-binary=:all:",
                        str(wheels[0])], check=True, env=env)
        subprocess.run([str(py), "-c", "import fabrickv"], check=True, env=env)
        return time.monotonic() - start


def report(rows: list[dict[str, Any]]) -> None:
    print("| measurement | value | baseline | ratio | target | met |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['what']} | {r['value']:.4g} {r['unit']} | {r['baseline']:.4g} "
              f"{r['unit']} | {r['ratio']:.3g} | {r['target_text']} | "
              f"{'yes' if r['met'] else 'no'} |")
    print()
    for r in rows:
        print(json.dumps({"bench": f"front_door.{r['name']}", "value": round(r["value"], 5),
                          "baseline": round(r["baseline"], 5), "unit": r["unit"],
                          "ratio": round(r["ratio"], 4), "target": r["target"],
                          "met": r["met"], "runs": r["runs"], "baseline_runs": r["base_runs"]}))


def row(name: str, what: str, unit: str, runs: list[float], base_runs: list[float],
        higher_better: bool = True) -> dict[str, Any]:
    value, base = statistics.median(runs), statistics.median(base_runs)
    ratios = [a / b for a, b in zip(runs, base_runs) if b > 0]
    ratio = statistics.median(ratios) if ratios else 0.0
    target = TARGETS[name]
    return {"name": name, "what": what, "unit": unit, "value": value, "baseline": base,
            "ratio": ratio, "target": target, "target_text": f">= {target:g}",
            "met": ratio >= target, "runs": [round(x, 5) for x in runs],
            "base_runs": [round(x, 5) for x in base_runs]}


def paired_runs(binary: Path, transport: str, rounds: int,
                measure: Callable[[str], tuple[float, ...]]) -> list[list[float]]:
    """`rounds` runs of `measure(address)` (figures and, last, their
    baseline) on one server of `transport`, after one uncounted run,
    stopped at the end; one series per figure. The uncounted run is the
    fresh server's first: its get_many_into ran at about half the later
    rounds' rate (cold pages on both sides), which a server in use has
    paid long before."""
    server = Server(binary, transport)
    series: list[list[float]] = []
    try:
        pin_client()
        measure(server.native)
        for _ in range(rounds):
            pin_client()
            figures = measure(server.native)
            if not series:
                series = [[] for _ in figures]
            for s, x in zip(series, figures):
                s.append(x)
    finally:
        server.stop()
    return series


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "fabrickv"))
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=",".join(TARGETS), help="comma-separated names")
    args = ap.parse_args()
    binary = Path(args.bin)
    if not binary.exists():
        print(f"{binary} is missing: run `make build`", file=sys.stderr)
        return 2
    if not args.duration > 0 or args.rounds < 1:
        print("--duration must be positive and --rounds at least 1", file=sys.stderr)
        return 2
    only = set(args.only.split(","))
    unknown = only - set(TARGETS)
    if unknown:
        print(f"unknown measurements {sorted(unknown)}; known: {sorted(TARGETS)}",
              file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    d, n = args.duration, args.rounds

    if only & {"pull_out", "async_pull"}:
        server = Server(binary, "tcp")
        try:
            rust_runs: list[float] = []
            out_runs: list[float] = []
            block_runs: list[float] = []
            async_runs: list[float] = []
            # A round that is not counted: the Rust client loads the table,
            # and both sides warm the server and their paths up.
            rust_mkv_s(binary, server.native, WARM_UP_S, load=True)
            pin_client()
            python_pull_out_mkv_s(server.native, WARM_UP_S)
            for r in range(n):
                if r % 2 == 0:
                    rust_runs.append(rust_mkv_s(binary, server.native, d, load=False))
                    pin_client()
                    out_runs.append(python_pull_out_mkv_s(server.native, d))
                else:
                    pin_client()
                    out_runs.append(python_pull_out_mkv_s(server.native, d))
                    rust_runs.append(rust_mkv_s(binary, server.native, d, load=False))
                if "async_pull" in only:
                    block_runs.append(out_runs[-1])
                    async_runs.append(async_pull_mkv_s(server.native, d))
        finally:
            server.stop()
        if "pull_out" in only:
            rows.append(row("pull_out", "pull(out=) 100x128 f32 vs Rust client, tcp", "Mkeys/s",
                            out_runs, rust_runs))
        if "async_pull" in only:
            rows.append(row("async_pull", f"asyncio pull, {ASYNC_IN_FLIGHT} in flight vs "
                            "blocking, tcp", "Mkeys/s", async_runs, block_runs))

    if "exists_many" in only:
        many_runs, single_runs = paired_runs(binary, "tcp", n,
                                             lambda addr: exists_rates(addr, d))
        rows.append(row("exists_many", "exists_many(1000) vs 1000 exists, tcp", "batches/s",
                        many_runs, single_runs))

    if only & {"get_many_into", "get_many_into_any"}:
        reg_runs, any_runs, copy_runs = paired_runs(binary, "shm", n,
                                                    lambda addr: get_many_rates(addr, d))
        if "get_many_into" in only:
            rows.append(row("get_many_into", "get_many_into 64x256KiB shm, registered out, "
                            "vs memcpy", "GB/s", reg_runs, copy_runs))
        if "get_many_into_any" in only:
            rows.append(row("get_many_into_any", "get_many_into 64x256KiB shm, numpy out, "
                            "vs memcpy", "GB/s", any_runs, copy_runs))

    if "wheel" in only:
        took = wheel_seconds()
        if took is not None:
            rows.append({"name": "wheel", "what": "wheel install + import, fresh venv",
                         "unit": "s", "value": took, "baseline": TARGETS["wheel"],
                         "ratio": took / TARGETS["wheel"], "target": TARGETS["wheel"],
                         "target_text": "< 10 s", "met": took < TARGETS["wheel"],
                         "runs": [round(took, 3)], "base_runs": []})

    print(f"Python front door, median of {n} x {d:g} s per side:\n")
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

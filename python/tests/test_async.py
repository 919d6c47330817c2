"""The asyncio clients (`AsyncClient`, `AsyncCacheClient`, `AsyncCluster`,
`AsyncClusterCache` and their tables) on every native transport: their
calls are awaitable and answer as the blocking ones do; many of them run
in flight from one `asyncio.gather` on a fixed set of worker threads (no
thread per call); a cancelled await propagates, leaves no caller memory
written after it returns, and leaves the connections serving.

Needs `make python` and `make build`."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import uuid
from typing import Any

import numpy as np
import pytest

from conftest import ROOT, Server, value_bytes

try:
    import fabrickv
except ImportError as e:  # a missing build fails the run, never skips it
    pytest.fail(f"the fabrickv module is not installed ({e}): run `make python`",
                pytrace=False)

DIM = 16

# Calls in flight at once from one gather.
IN_FLIGHT = 64

# How long a whole async test may take before it fails; generous, as the
# machine may be busy.
DEADLINE_S = 60.0


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))


def name() -> str:
    return f"aio_{uuid.uuid4().hex[:8]}"


def worker_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("fabrickv-async")}


def test_async_client_kv_and_tables(ps_server: Server) -> None:
    async def main() -> None:
        async with fabrickv.AsyncClient(ps_server.native, workers=3) as c:
            await c.put(b"a", b"1")
            assert await c.get(b"a") == b"1"
            assert await c.mget([b"a", b"nope"]) == [b"1", None]
            t = await c.create_table(name(), dim=DIM)
            keys = np.arange(1, 1 + 32 * IN_FLIGHT, dtype=np.uint64).reshape(IN_FLIGHT, 32)
            values = np.random.default_rng(1).standard_normal(
                (IN_FLIGHT, 32, DIM)).astype(np.float32)
            await asyncio.gather(*(t.put(k, v) for k, v in zip(keys, values)))
            outs = [np.zeros((32, DIM), np.float32) for _ in range(IN_FLIGHT)]
            got = await asyncio.gather(*(t.pull(k, out=o) for k, o in zip(keys, outs)))
            assert all(g is o for g, o in zip(got, outs))
            assert all(np.array_equal(o, v) for o, v in zip(outs, values))
            pulled, found = await t.pull(keys[0], return_found=True)
            assert np.array_equal(pulled, values[0]) and found.all()
            # A fixed pool: as many threads as workers, whatever the calls.
            assert len(worker_threads()) <= 3
        assert c.closed
        with pytest.raises(fabrickv.Error) as e:
            await c.get(b"a")
        assert e.value.code == "UNAVAILABLE"

    run(main())


def test_async_cache_batches(kv_server: Server) -> None:
    async def main() -> None:
        async with fabrickv.AsyncCacheClient(kv_server.native, buffer_mb=4, workers=2) as c:
            prefix = name()
            keys = [f"{prefix}-{i}".encode() for i in range(IN_FLIGHT)]
            blocks = np.random.default_rng(2).integers(0, 256, (IN_FLIGHT, 4096), dtype=np.uint8)
            await asyncio.gather(*(c.put(k, b) for k, b in zip(keys, blocks)))
            assert await c.exists_many(keys + [b"absent"]) == [True] * IN_FLIGHT + [False]
            assert await c.prefix_hits(keys[:10] + [b"absent"] + keys[10:]) == 10
            outs = np.zeros_like(blocks)
            lens = await c.get_many_into(keys, outs.reshape(-1),
                                         offsets=[i * 4096 for i in range(IN_FLIGHT)], sizes=4096)
            assert lens == [4096] * IN_FLIGHT and np.array_equal(outs, blocks)
            one = bytearray(4096)
            assert await c.get(keys[0], one) == 4096 and bytes(one) == blocks[0].tobytes()
            assert await c.delete_many(keys[:2]) == [True, True]

    run(main())


def test_cancelled_calls_propagate_and_leave_the_connections_serving(kv_server: Server) -> None:
    async def main() -> None:
        async with fabrickv.AsyncCacheClient(kv_server.native, buffer_mb=4, workers=2) as c:
            k = f"{name()}-big".encode()
            value = np.random.default_rng(3).integers(0, 256, 2 << 20, dtype=np.uint8)
            await c.put(k, value)
            outs = [np.zeros_like(value) for _ in range(IN_FLIGHT)]
            tasks = [asyncio.ensure_future(c.get_into(k, o)) for o in outs]
            await asyncio.sleep(0)
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
            assert cancelled > 0, "the cancellations reached the awaits"
            # Each output is now whole or untouched, and stays so: nothing
            # writes it after its await ended.
            snapshot = [o.copy() for o in outs]
            for o, r in zip(outs, results):
                assert np.array_equal(o, value) or not o.any(), r
            # The workers serve on, in step: every call of a full round
            # over them answers right.
            for _ in range(4 * c.workers):
                again = np.zeros_like(value)
                assert await c.get_into(k, again) == value.nbytes
                assert np.array_equal(again, value)
            assert all(np.array_equal(o, s) for o, s in zip(outs, snapshot))

    run(main())


def test_cancelling_a_gather_of_pulls(ps_server: Server) -> None:
    async def main() -> None:
        async with fabrickv.AsyncClient(ps_server.native, workers=2) as c:
            t = await c.create_table(name(), dim=DIM)
            keys = np.arange(1, 2001, dtype=np.uint64)
            await t.put(keys, np.ones((2000, DIM), np.float32))
            gathered = asyncio.gather(*(t.pull(keys) for _ in range(IN_FLIGHT)))
            await asyncio.sleep(0)
            gathered.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gathered
            got = await t.pull(keys)
            assert np.array_equal(got, np.ones((2000, DIM), np.float32))

    run(main())


def test_async_cluster_forms(cluster_servers: list[Server]) -> None:
    addrs = [s.native for s in cluster_servers]

    async def main() -> None:
        async with fabrickv.AsyncCluster(addrs, workers=2) as c:
            await c.mput([(b"x", b"1"), (b"y", b"2")])
            assert await c.mget([b"x", b"y"]) == [b"1", b"2"]
            assert await c.mdelete([b"x", b"zz"]) == [True, False]
            t = await c.create_table(name(), dim=DIM)
            keys = np.arange(1, 301, dtype=np.uint64)
            values = np.random.default_rng(4).standard_normal((300, DIM)).astype(np.float32)
            await t.put(keys, values)
            outs = [np.zeros((300, DIM), np.float32) for _ in range(8)]
            await asyncio.gather(*(t.pull(keys, out=o) for o in outs))
            assert all(np.array_equal(o, values) for o in outs)
        async with fabrickv.AsyncClusterCache(addrs, buffer_mb=2, workers=2) as cc:
            prefix = name()
            keys_c = [f"{prefix}-{i}".encode() for i in range(30)]
            await asyncio.gather(*(cc.put(k, k * 10) for k in keys_c))
            assert await cc.exists_many(keys_c) == [True] * 30
            assert await cc.prefix_hits(keys_c) == 30
            assert value_bytes(await cc.get(keys_c[3])) == keys_c[3] * 10

    run(main())


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        fabrickv.AsyncClient("127.0.0.1:1", workers=0)


ASYNC_EXAMPLE = ROOT / "python" / "examples" / "train_embedding_async.py"


def test_the_async_training_example_lowers_its_loss(ps_server: Server) -> None:
    proc = subprocess.run(
        [sys.executable, str(ASYNC_EXAMPLE), ps_server.native, "--table", name(),
         "--steps", "60"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"final loss_start=(\S+) loss_end=(\S+)", last)
    assert m, f"unexpected last line {last!r}"
    start, end = float(m.group(1)), float(m.group(2))
    assert end < start / 10, f"the loss fell from {start} to only {end}"

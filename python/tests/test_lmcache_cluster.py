"""LMCache's `redis-cluster://` remote backend, as its RedisClusterConnector
drives redis-py's asyncio `RedisCluster`, on a FabricKV cluster in etcd with
two copies of each slot: KV chunks are found and read back whole, and still
are through the same client after a primary is killed with SIGKILL.

Needs `make build` (the server) and etcd (`make deps`)."""

import asyncio
import itertools
import os
import re
import signal
import struct
import subprocess
import time
import uuid
from typing import Iterator, Sequence, cast

import pytest
import redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from conftest import BIN, Etcd, Server, stop_all

# 64 tokens of Llama-3.2-1B in LMCache's KV_2LTD format, [2, layers, tokens,
# heads * head_dim] in bfloat16: 2 MiB, over 1 MiB as real chunks are.
SHAPE = (2, 16, 64, 512)
CHUNK_BYTES = 2 * SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[3]
CHUNKS = 24
# Failover takes about half a second here; room for a loaded machine.
SETTLE_S = 60.0


def key(tag: str, i: int) -> str:
    """CacheEngineKey.to_string() of chunk `i`."""
    return f"vllm@meta-llama/Llama-3.2-1B@1@0@{tag}{i:08x}"


def settled(url: str, name: str) -> bool:
    """Whether `cluster show` lists three groups, each with one in-sync backup."""
    out = subprocess.run([str(BIN), "cluster", "show", "--registry", url, "--cluster", name],
                         capture_output=True, text=True, timeout=30).stdout
    return len(re.findall(r"^  slots .* backups \[\d+\]$", out, re.M)) == 3


@pytest.fixture
def copies(etcd: Etcd) -> Iterator[list[Server]]:
    """Three servers keeping two copies of each slot, and their controller."""
    name = f"lmc-{uuid.uuid4().hex[:8]}"
    ctl = subprocess.Popen([str(BIN), "cluster", "controller", "--registry", etcd.url,
                            "--cluster", name],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers: list[Server] = []
    try:
        for i in range(3):
            servers.append(Server("--registry", etcd.url, "--cluster", name, "--id", str(i),
                                  "--cluster-size", "3", "--replicas", "2",
                                  "--large-memory", "512MB", workers=1))
        deadline = time.monotonic() + SETTLE_S
        while not settled(etcd.url, name):
            assert time.monotonic() < deadline, "never two copies of each slot"
            time.sleep(0.05)
        yield servers
    finally:
        stop_all([s for s in servers if s.proc.poll() is None])
        ctl.kill()
        ctl.wait()


def connect(servers: Sequence[Server]) -> RedisCluster:
    """The connector's client for `redis-cluster://h0:p0,h1:p1,h2:p2`."""
    return RedisCluster(startup_nodes=[ClusterNode(s.resp_host, s.resp_port) for s in servers],
                        max_connections=150, decode_responses=False)


def port_of(node: ClusterNode | None) -> int:
    """The port of the node redis-py routes a key to: typed optional, with
    a `str | int` port, it is a node of the slot map read from the cluster,
    whose ports are ints."""
    assert node is not None and isinstance(node.port, int), node
    return node.port


async def put(rc: RedisCluster, keys: Sequence[str], chunks: dict[str, bytes]) -> None:
    """batched_put: every chunk at once, kv_bytes, then its RemoteMetadata."""
    async def one(k: str) -> None:
        await rc.set(k + "kv_bytes", chunks[k])
        await rc.set(k + "metadata", struct.pack("7i", len(chunks[k]), 1, 3, *SHAPE))
    await asyncio.gather(*(one(k) for k in keys))


async def contains(rc: RedisCluster, keys: Sequence[str]) -> int:
    """batched_async_contains: how many leading chunks are stored."""
    for n, k in enumerate(keys):
        if not await rc.exists(k + "metadata"):
            return n
    return len(keys)


async def get(rc: RedisCluster, keys: Sequence[str]) -> list[bytes]:
    """batched_get_non_blocking: each chunk's metadata, then its bytes."""
    async def one(k: str) -> bytes:
        length = struct.unpack("7i", cast(bytes, await rc.get(k + "metadata")))[0]
        return cast(bytes, await rc.get(k + "kv_bytes"))[:length]
    return await asyncio.gather(*(one(k) for k in keys))


def handed_over(servers: Sequence[Server], port: int) -> bool:
    """Whether no server but the one on `port` names it in CLUSTER SLOTS."""
    for s in servers:
        if s.resp_port != port:
            with redis.Redis(host=s.resp_host, port=s.resp_port) as r:
                if any(n[1] == port for g in r.execute_command("CLUSTER", "SLOTS")
                       for n in g[2:]):
                    return False
    return True


def test_chunks_are_found_whole_and_spread_over_the_servers(copies: list[Server]) -> None:
    tag = uuid.uuid4().hex[:8]
    keys = [key(tag, i) for i in range(CHUNKS)]
    chunks = {k: os.urandom(CHUNK_BYTES) for k in keys}
    owners: list[int] = []

    async def go() -> None:
        rc = connect(copies)
        try:
            # The slot map read before the first put: 24 concurrent SETs on
            # a client that has not read it yet fail inside redis-py 8.1's
            # asyncio client (a connection closed under another task while
            # it follows -MOVED), against a Redis 7 cluster too. A value
            # over 1 MiB sent to the wrong server is answered -MOVED like
            # any other (checked below).
            await rc.initialize()
            await put(rc, keys, chunks)
            assert await contains(rc, keys) == CHUNKS
            assert await contains(rc, keys[:3] + [key(tag, CHUNKS)] + keys[3:]) == 3
            assert await get(rc, keys) == [chunks[k] for k in keys]
            owners.extend(port_of(rc.get_node_from_key(k + "kv_bytes")) for k in keys)
        finally:
            await rc.aclose()

    asyncio.run(asyncio.wait_for(go(), 3 * SETTLE_S))
    # Each chunk is on the primary the client chose; the others send it there.
    for s in copies:
        with redis.Redis(host=s.resp_host, port=s.resp_port) as plain:
            for k, port in zip(keys, owners):
                if s.resp_port == port:
                    assert plain.strlen(k + "kv_bytes") == CHUNK_BYTES
                else:
                    with pytest.raises(redis.exceptions.MovedError, match=f":{port}$"):
                        plain.strlen(k + "kv_bytes")
                    # A chunk sent to the wrong server is sent on, too.
                    with pytest.raises(redis.exceptions.MovedError, match=f":{port}$"):
                        plain.set(k + "kv_bytes", chunks[k])
    assert len(set(owners)) > 1, owners


def test_a_killed_primary_loses_no_chunk_and_the_client_follows(copies: list[Server]) -> None:
    tag = uuid.uuid4().hex[:8]
    before = [key(tag, i) for i in range(CHUNKS)]
    chunks = {k: os.urandom(CHUNK_BYTES) for k in before}

    async def go() -> None:
        rc = connect(copies)

        def owner(k: str) -> int:
            return port_of(rc.get_node_from_key(k + "kv_bytes"))

        try:
            # A lookup (all misses) before the store, as a serving engine does.
            assert await contains(rc, before) == 0
            await put(rc, before, chunks)
            port = owner(before[0])
            # New chunks, the first of them in the killed primary's slots.
            fresh = (key(tag, i) for i in itertools.count(CHUNKS))
            after = [next(k for k in fresh if owner(k) == port), *itertools.islice(fresh, 7)]
            chunks.update((k, os.urandom(CHUNK_BYTES)) for k in after)
            victim = next(s for s in copies if s.resp_port == port)
            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait()
            # Puts to its slots fail until the controller hands them over
            # (LMCache logs them and goes on); then the same client, told
            # nothing, must reach the new primary on its own.
            deadline = time.monotonic() + SETTLE_S
            while not handed_over(copies, port):
                assert time.monotonic() < deadline, "the killed primary's slots stayed its"
                await asyncio.sleep(0.05)
            await put(rc, after[:1], chunks)
            # Every acknowledged chunk, those of the killed primary included.
            assert await contains(rc, before) == CHUNKS
            assert await get(rc, before) == [chunks[k] for k in before]
            assert owner(before[0]) != port
            await put(rc, after, chunks)
            assert await contains(rc, before + after) == len(before + after)
            assert await get(rc, after) == [chunks[k] for k in after]
        finally:
            await rc.aclose()

    asyncio.run(asyncio.wait_for(go(), 3 * SETTLE_S))

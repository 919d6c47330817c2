"""Values over 1 MiB (up to Redis's 512 MiB) over RESP with redis-py, the
way LMCache (vLLM's KV-cache layer) uses Redis: chunks of 16 MiB under
`prefix:{hash}:kv_bytes` beside small `:metadata` keys, then EXISTS and
GET with every byte checked. A short run (a few hundred MiB, well under a
minute on two cores); the full 1,000 x 16 MiB run is scripts/lmcache-run.py."""

import hashlib
import json
import os
import socket
from typing import Iterator

import pytest
import redis

from conftest import Server

MIB = 1 << 20
CHUNK_BYTES = 16 * MIB
# Chunks of the short run: 512 MiB in all.
CHUNKS = 32
PREFIX = "vllm@model@1@0"


@pytest.fixture(scope="module")
def large_server() -> Iterator[Server]:
    # The default --memory (64MB) is for small items; large values have
    # their own budget, split over the two workers (1 GiB each here).
    s = Server("--large-memory", "2GB")
    yield s
    assert s.stop() == 0, "the server exits cleanly on SIGTERM"


@pytest.fixture
def r(large_server: Server) -> Iterator[redis.Redis]:
    c = redis.Redis(host=large_server.resp_host, port=large_server.resp_port,
                    socket_timeout=60)
    yield c
    c.close()


def chunk(base: bytes, i: int) -> bytes:
    """Chunk `i`: the random base rotated, so each chunk differs."""
    k = (i * 4099) % len(base)
    return base[k:] + base[:k]


def test_lmcache_style_chunks(r: redis.Redis) -> None:
    base = os.urandom(CHUNK_BYTES)
    keys = []
    for i in range(CHUNKS):
        h = hashlib.sha256(f"tokens-{i}".encode()).hexdigest()[:16]
        key = f"{PREFIX}:{h}"
        keys.append(key)
        meta = json.dumps({"shape": [2, 32, 256, 8, 128], "dtype": "bfloat16",
                           "fmt": "vllm", "chunk": i}).encode()
        assert r.set(f"{key}:metadata", meta) is True
        assert r.set(f"{key}:kv_bytes", chunk(base, i)) is True
    for key in keys:
        assert r.exists(f"{key}:kv_bytes", f"{key}:metadata") == 2
    assert r.exists(f"{PREFIX}:absent:kv_bytes") == 0
    for i, key in enumerate(keys):
        raw_meta = r.get(f"{key}:metadata")
        assert isinstance(raw_meta, bytes)
        meta = json.loads(raw_meta)
        assert meta["chunk"] == i
        got = r.get(f"{key}:kv_bytes")
        assert isinstance(got, bytes) and len(got) == CHUNK_BYTES
        assert got == chunk(base, i), f"chunk {i} differs"
    # SCAN MATCH is how LMCache lists what it stored. Main has no SCAN yet
    # (it is being added beside this); until it lands, the step is skipped.
    try:
        found = set(r.scan_iter(match=f"{PREFIX}:*:kv_bytes", count=100))
    except redis.ResponseError as e:
        assert "unknown command" in str(e)
    else:
        assert found == {f"{k}:kv_bytes".encode() for k in keys}
    # Pipelined GETs of many chunks come back whole and in order.
    p = r.pipeline(transaction=False)
    for key in keys[:8]:
        p.get(f"{key}:kv_bytes")
    for i, got in enumerate(p.execute()):
        assert got == chunk(base, i)
    assert r.delete(*[f"{k}:kv_bytes" for k in keys]) == CHUNKS
    info = r.info("memory")
    assert info["large_values_bytes"] == 0
    assert info["large_receiving_bytes"] == 0


def test_mget_and_sizes(r: redis.Redis) -> None:
    values = {f"mget:{i}": os.urandom(CHUNK_BYTES) for i in range(4)}
    assert r.mset({"mget:small": b"s"})
    for k, v in values.items():
        assert r.set(k, v)
    got = r.mget(list(values) + ["mget:small", "mget:absent"])
    assert got[:4] == list(values.values())
    assert got[4:] == [b"s", None]
    big = os.urandom(100 * MIB)
    assert r.set("hundred", big, ex=600)
    assert r.get("hundred") == big
    assert r.strlen("hundred") == 100 * MIB
    assert 590 < r.ttl("hundred") <= 600
    r.delete("hundred", *values)


def test_one_byte_over_512_mib_is_refused(large_server: Server) -> None:
    s = socket.create_connection((large_server.resp_host, large_server.resp_port),
                                 timeout=10)
    s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % ((512 << 20) + 1))
    reply = b""
    while not reply.endswith(b"\r\n"):
        got = s.recv(1024)
        if not got:
            break
        reply += got
    assert reply == b"-ERR Protocol error: invalid bulk length\r\n"
    s.close()

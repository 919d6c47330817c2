"""The batched cache calls inference engines make, on a server per native
transport and on a three-server cluster: `exists_many` (one round trip
per server, request order kept), `prefix_hits` (stops at the first miss),
`delete_many`, and `get_many_into` / `put_many_from` over a list of
buffers or one buffer cut by offsets.

Needs `make python` and `make build`."""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterator, Union

import numpy as np
import pytest

from conftest import Server

try:
    import fabrickv
except ImportError as e:  # a missing build fails the run, never skips it
    pytest.fail(f"the fabrickv module is not installed ({e}): run `make python`",
                pytrace=False)

# More keys than one round of requests in flight (CACHE_BATCH_KEYS_MAX).
MANY = 1024 + 200

BLOCK_BYTES = 64 << 10

AnyCache = Union[fabrickv.CacheClient, fabrickv.ClusterCache]


@pytest.fixture(params=["one", "cluster"])
def cache(request: pytest.FixtureRequest, kv_server: Server,
          cluster_servers: list[Server]) -> Iterator[AnyCache]:
    """A single server's client and a cluster's, on each transport (the
    pairs of a server and a cluster of different transports are left
    out)."""
    if cluster_servers[0].transport != kv_server.transport:
        pytest.skip("the server and the cluster run different transports")
    if request.param == "one":
        with fabrickv.CacheClient(kv_server.native, buffer_mb=4) as c:
            yield c
    else:
        with fabrickv.ClusterCache([s.native for s in cluster_servers], buffer_mb=4) as cc:
            yield cc


@pytest.fixture
def key() -> Callable[[int], bytes]:
    prefix = uuid.uuid4().hex[:8]
    return lambda i: f"bat-{prefix}-{i}".encode()


def blocks(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(0, 256, (n, BLOCK_BYTES), dtype=np.uint8)


def test_exists_many_answers_each_key_in_order(cache: AnyCache,
                                              key: Callable[[int], bytes]) -> None:
    keys = [key(i) for i in range(MANY)]
    for i in range(0, MANY, 7):
        cache.put(keys[i], b"x")
    assert cache.exists_many(keys) == [i % 7 == 0 for i in range(MANY)]
    assert cache.exists_many([]) == []
    assert cache.exists_many([k.decode() for k in keys[:8]]) == [i % 7 == 0 for i in range(8)]


def test_prefix_hits_counts_until_the_first_miss(cache: AnyCache,
                                                key: Callable[[int], bytes]) -> None:
    keys = [key(i) for i in range(MANY)]
    for k in keys[:1100]:
        cache.put(k, b"x")
    cache.delete(keys[500])
    assert cache.prefix_hits(keys) == 500
    assert cache.prefix_hits(keys[501:]) == 1100 - 501
    assert cache.prefix_hits(keys[:500]) == 500
    assert cache.prefix_hits([key(-1)] + keys) == 0
    assert cache.prefix_hits([]) == 0


def test_delete_many_says_which_were_there(cache: AnyCache,
                                          key: Callable[[int], bytes]) -> None:
    keys = [key(i) for i in range(10)]
    for k in keys[::2]:
        cache.put(k, b"x")
    assert cache.delete_many(keys) == [i % 2 == 0 for i in range(10)]
    assert cache.exists_many(keys) == [False] * 10


def test_put_many_from_and_get_many_into_with_lists(cache: AnyCache,
                                                   key: Callable[[int], bytes]) -> None:
    keys = [key(i) for i in range(64)]
    src = blocks(64, 1)
    gens = cache.put_many_from(keys, list(src))
    assert len(gens) == 64 and all(g > 0 for g in gens)
    outs = [np.zeros(BLOCK_BYTES, np.uint8) for _ in range(65)]
    got = cache.get_many_into(keys + [key(-1)], outs)
    assert got == [BLOCK_BYTES] * 64 + [None]
    assert all(np.array_equal(o, s) for o, s in zip(outs, src))
    assert not outs[64].any()


def test_one_buffer_cut_by_offsets_both_ways(cache: AnyCache,
                                            key: Callable[[int], bytes]) -> None:
    keys = [key(i) for i in range(64)]
    src = blocks(64, 2)
    flat = src.reshape(-1)
    offsets = [i * BLOCK_BYTES for i in range(64)]
    cache.put_many_from(keys, flat, offsets=offsets, sizes=BLOCK_BYTES)
    # Read back in reverse order into one buffer, slots given one by one.
    dst = np.zeros_like(flat)
    got = cache.get_many_into(keys[::-1], dst, offsets=offsets, sizes=[BLOCK_BYTES] * 64)
    assert got == [BLOCK_BYTES] * 64
    assert np.array_equal(dst.reshape(64, BLOCK_BYTES), src[::-1])
    # Slots smaller than the value: refused, slot untouched.
    small = np.full(2 * BLOCK_BYTES, 7, np.uint8)
    with pytest.raises(fabrickv.Error) as e:
        cache.get_many_into(keys[:2], small, offsets=[0, BLOCK_BYTES], sizes=BLOCK_BYTES - 1)
    assert e.value.code == "BUFFER_TOO_SMALL"
    assert (small[:BLOCK_BYTES - 1] == 7).all()


def test_bad_batches_are_refused(cache: AnyCache, key: Callable[[int], bytes]) -> None:
    buf = bytearray(100)
    with pytest.raises(ValueError, match="past"):
        cache.get_many_into([key(0)], buf, offsets=[90], sizes=20)
    with pytest.raises(ValueError, match="sizes"):
        cache.get_many_into([key(0)], buf, offsets=[0])
    with pytest.raises(ValueError, match="1 keys but 2 offsets"):
        cache.put_many_from([key(0)], buf, offsets=[0, 10], sizes=10)
    with pytest.raises(TypeError, match="list of buffers"):
        cache.put_many_from([key(0)], buf)
    with pytest.raises(fabrickv.Error) as e:
        cache.exists_many([b"x" * 1025])
    assert e.value.code == "KEY_TOO_LONG"
    assert cache.exists_many([key(0)]) == [False]


def test_get_many_into_registered_memory_lands_in_place(kv_server: Server,
                                                       key: Callable[[int], bytes]) -> None:
    """Over shm the server writes each value straight into memory from
    `register_buffer`: a value larger than the 1 MiB receive buffer reads
    there, which the copying path refuses. Over tcp, registering is
    refused with UNAVAILABLE."""
    with fabrickv.CacheClient(kv_server.native, buffer_mb=1) as c:
        if not c.one_sided:
            with pytest.raises(fabrickv.Error) as e:
                c.register_buffer(1 << 20)
            assert e.value.code == "UNAVAILABLE"
            return
        big = 2 << 20
        n = 8
        keys = [key(i) for i in range(n)]
        src = np.random.default_rng(5).integers(0, 256, (n, big), dtype=np.uint8)
        c.put_many_from(keys, list(src))
        reg = c.register_buffer(n * big)
        assert reg.shape == (n * big,) and reg.dtype == np.uint8 and not reg.any()
        offsets = [i * big for i in range(n)]
        # Read in reverse order; views of the registered memory count as it.
        got = c.get_many_into(keys[::-1], reg, offsets=offsets, sizes=big)
        assert got == [big] * n
        assert np.array_equal(reg.reshape(n, big), src[::-1])
        halves = reg.view(np.float16).reshape(n, big // 2)
        halves[:] = 0
        assert c.get_many_into(keys, list(halves)) == [big] * n
        assert np.array_equal(reg.reshape(n, big), src)
        # One key into it too; the copying path is bounded by the
        # receive buffer.
        reg[:big] = 0
        assert c.get_into(keys[3], reg[:big]) == big
        assert np.array_equal(reg[:big], src[3])
        plain = np.zeros(big, np.uint8)
        for read in (lambda: c.get_many_into(keys[:1], [plain]),
                     lambda: c.get_into(keys[0], plain)):
            with pytest.raises(fabrickv.Error) as e:
                read()
            assert e.value.code == "BUFFER_TOO_SMALL"
        # An absent key leaves its place untouched; a place too small is
        # refused before anything is written.
        reg[:] = 9
        assert c.get_many_into([key(99), keys[0]], reg, offsets=[0, big],
                               sizes=big) == [None, big]
        assert (reg[:big] == 9).all() and np.array_equal(reg[big:2 * big], src[0])
        with pytest.raises(fabrickv.Error) as e:
            c.get_many_into(keys[1:2], reg, offsets=[0], sizes=big - 1)
        assert e.value.code == "BUFFER_TOO_SMALL"
        assert (reg[:big] == 9).all()


def test_registered_memory_outlives_its_client(kv_server: Server,
                                              key: Callable[[int], bytes]) -> None:
    """An array over registered memory stays valid after its client is
    closed and dropped; the closed client refuses calls."""
    import gc
    c = fabrickv.CacheClient(kv_server.native, buffer_mb=1)
    if not c.one_sided:
        c.close()
        pytest.skip("tcp registers no memory")
    c.put(key(0), blocks(1, 7)[0])
    reg = c.register_buffer(BLOCK_BYTES)
    assert c.get_many_into([key(0)], [reg]) == [BLOCK_BYTES]
    c.close()
    with pytest.raises(fabrickv.Error) as e:
        c.get_many_into([key(0)], [reg])
    assert e.value.code == "UNAVAILABLE"
    del c
    gc.collect()
    assert np.array_equal(reg, blocks(1, 7)[0])
    reg[:] = 1
    assert int(reg.sum()) == BLOCK_BYTES

"""Any memory in, any memory out: the cache and the embedding tables, and
their cluster forms, read values and fill `out=` in place from numpy
arrays, buffer-protocol objects (bytes, bytearray, memoryview) and CPU
tensors with `__dlpack__` (numpy's own export, a bfloat16 tensor numpy
cannot hold, torch where it is installed), on every native transport.
Memory that cannot be used (strided, read-only, misaligned, of the wrong
type, on another device) is refused before anything is sent.

Needs `make python` and `make build`."""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from conftest import Server, value_bytes
from dlpack_util import DL_CUDA, DlpackOnly, RawTensor, bf16_tensor

try:
    import fabrickv
except ImportError as e:  # a missing build fails the run, never skips it
    pytest.fail(f"the fabrickv module is not installed ({e}): run `make python`",
                pytrace=False)

# A KV block: (layers, 2, heads, block, head_dim).
BLOCK_SHAPE = (2, 2, 4, 16, 32)

# What a test fills an output with before a read, to see what it wrote.
SENTINEL = 0xAB

DIM = 8


@pytest.fixture
def cache(kv_server: Server) -> Iterator[fabrickv.CacheClient]:
    with fabrickv.CacheClient(kv_server.native, buffer_mb=8) as c:
        yield c


@pytest.fixture
def key() -> Callable[[str], bytes]:
    prefix = uuid.uuid4().hex[:8]
    return lambda name: f"buf-{prefix}-{name}".encode()


@pytest.fixture
def table(ps_server: Server) -> Iterator[fabrickv.Table]:
    with fabrickv.Client(ps_server.native) as c:
        yield c.create_table(f"buf_{uuid.uuid4().hex[:8]}", dim=DIM)


def block(seed: int, dtype: Any = np.float16) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(BLOCK_SHAPE).astype(dtype)


def test_cache_values_go_in_from_every_kind_of_memory(cache: fabrickv.CacheClient,
                                                     key: Callable[[str], bytes]) -> None:
    b = block(1)
    raw = b.tobytes()
    sources: dict[str, Any] = {
        "ndarray": b,
        "bytes": raw,
        "bytearray": bytearray(raw),
        "memoryview": memoryview(raw),
        "memoryview-of-array": memoryview(b.data),
        "np.from_dlpack": np.from_dlpack(b),
        "dlpack-only": DlpackOnly(b),
    }
    for name, src in sources.items():
        cache.put(key(name), src)
        assert value_bytes(cache.get(key(name))) == raw, name


def test_cache_outputs_of_every_kind_are_filled_in_place(cache: fabrickv.CacheClient,
                                                        key: Callable[[str], bytes]) -> None:
    b = block(2)
    cache.put(key("b"), b)
    nbytes = b.nbytes
    arr = np.full(BLOCK_SHAPE, np.nan, np.float16)
    assert cache.get_into(key("b"), arr) == nbytes
    assert np.array_equal(arr, b)
    ba = bytearray(nbytes)
    assert cache.get(key("b"), out=ba) == nbytes
    assert bytes(ba) == b.tobytes()
    store = np.full(nbytes, SENTINEL, np.uint8)
    assert cache.get_into(key("b"), store.data) == nbytes
    assert store.tobytes() == b.tobytes()
    viewed = np.zeros(BLOCK_SHAPE, np.float16)
    assert cache.get_into(key("b"), DlpackOnly(viewed)) == nbytes
    assert np.array_equal(viewed, b)


def test_bfloat16_blocks_round_trip_through_dlpack(cache: fabrickv.CacheClient,
                                                  key: Callable[[str], bytes]) -> None:
    values = np.random.default_rng(3).standard_normal(BLOCK_SHAPE).astype(np.float32)
    src = bf16_tensor(values)
    cache.put(key("bf16"), src)
    dst = bf16_tensor(np.zeros(BLOCK_SHAPE, np.float32))
    assert cache.get_into(key("bf16"), dst) == src.storage.nbytes
    assert np.array_equal(dst.storage, src.storage)
    # Batched too, into a list of bf16 tensors.
    outs = [bf16_tensor(np.zeros(BLOCK_SHAPE, np.float32)) for _ in range(2)]
    assert cache.get_many_into([key("bf16"), key("absent")], outs) == [src.storage.nbytes, None]
    assert np.array_equal(outs[0].storage, src.storage)
    assert not outs[1].storage.any()


def test_unusable_memory_is_refused_before_anything_is_sent(
        cache: fabrickv.CacheClient, key: Callable[[str], bytes]) -> None:
    with pytest.raises(ValueError, match="contiguous"):
        cache.put(key("s"), np.zeros((8, 8), np.float16)[:, ::2])
    strided = RawTensor(np.zeros(16, np.uint16), 2, 16, (4, 2), strides=(4, 2))
    with pytest.raises(ValueError, match="contiguous"):
        cache.put(key("s"), strided)
    on_gpu = RawTensor(np.zeros(16, np.uint16), 2, 16, (16,), device=DL_CUDA)
    with pytest.raises(ValueError, match="device"):
        cache.put(key("s"), on_gpu)
    ro = np.zeros(64, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="read-only"):
        cache.get_into(key("s"), ro)
    with pytest.raises(TypeError, match="read-only"):
        cache.get_into(key("s"), DlpackOnly(ro))
    with pytest.raises(TypeError, match="buffer protocol"):
        cache.put(key("s"), [1, 2, 3])
    assert cache.exists(key("s")) is False


def test_torch_tensors_go_in_and_come_out_in_place(cache: fabrickv.CacheClient,
                                                  key: Callable[[str], bytes]) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (see docs/python.md)")
    for dtype in (torch.bfloat16, torch.float16):
        t = torch.randn(BLOCK_SHAPE, dtype=dtype)
        cache.put(key(str(dtype)), t)
        out = torch.zeros(BLOCK_SHAPE, dtype=dtype)
        assert cache.get_into(key(str(dtype)), out) == t.numel() * t.element_size()
        assert torch.equal(out, t)
    with pytest.raises(ValueError, match="contiguous"):
        cache.put(key("t"), torch.zeros(8, 8).t())


def test_table_pull_fills_every_kind_of_out(table: fabrickv.Table) -> None:
    keys = np.arange(1, 11, dtype=np.uint64)
    want = np.arange(10 * DIM, dtype=np.float32).reshape(10, DIM)
    table.put(keys, want)
    flat = np.zeros(10 * DIM, np.float32)
    assert table.pull(keys, out=flat) is flat
    assert np.array_equal(flat.reshape(10, DIM), want)
    shaped = np.zeros((10, DIM), np.float32)
    got, found = table.pull(keys, out=DlpackOnly(shaped), return_found=True)
    assert isinstance(got, DlpackOnly) and np.array_equal(shaped, want) and found.all()
    raw = bytearray(want.nbytes)
    table.pull(keys, out=raw)
    assert bytes(raw) == want.tobytes()
    mv_store = np.zeros((10, DIM), np.float32)
    table.pull(keys, out=mv_store.data)
    assert np.array_equal(mv_store, want)


def test_table_writes_read_dlpack_and_buffers_in_place(table: fabrickv.Table) -> None:
    keys = np.arange(100, 104, dtype=np.uint64)
    values = np.random.default_rng(4).standard_normal((4, DIM)).astype(np.float32)
    table.put(DlpackOnly(keys), DlpackOnly(values))
    assert np.array_equal(table.pull(keys), values)
    table.put(keys, (values * 2).data)
    assert np.array_equal(table.pull(keys), values * 2)


def test_table_refuses_unusable_outputs(table: fabrickv.Table) -> None:
    keys = np.arange(1, 5, dtype=np.uint64)
    with pytest.raises(TypeError, match="float32"):
        table.pull(keys, out=np.zeros((4, DIM), np.float64))
    with pytest.raises(ValueError, match="shape"):
        table.pull(keys, out=np.zeros((5, DIM), np.float32))
    with pytest.raises(ValueError, match="bytes"):
        table.pull(keys, out=bytearray(7))
    misaligned = memoryview(bytearray(4 * DIM * 4 + 1))[1:]
    with pytest.raises(ValueError, match="4-byte"):
        table.pull(keys, out=misaligned)
    ro = np.zeros((4, DIM), np.float32)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="read-only"):
        table.pull(keys, out=ro)
    with pytest.raises(TypeError, match="float32"):
        table.put(keys, bf16_tensor(np.zeros((4, DIM), np.float32)))


def test_torch_table_calls(table: fabrickv.Table) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (see docs/python.md)")
    keys = torch.arange(1, 9, dtype=torch.int64)
    values = torch.randn(8, DIM)
    table.put(keys, values)
    out = torch.zeros(8, DIM)
    assert table.pull(keys, out=out) is out
    assert torch.equal(out, values)


def test_cluster_forms_take_the_same_memory(cluster_servers: list[Server]) -> None:
    addrs = [s.native for s in cluster_servers]
    name = f"bufc_{uuid.uuid4().hex[:8]}"
    with fabrickv.Cluster(addrs) as c:
        t = c.create_table(name, dim=DIM)
        keys = np.arange(1, 41, dtype=np.uint64)
        want = np.random.default_rng(5).standard_normal((40, DIM)).astype(np.float32)
        t.put(DlpackOnly(keys), DlpackOnly(want))
        out = np.zeros((40, DIM), np.float32)
        t.pull(keys, out=DlpackOnly(out))
        assert np.array_equal(out, want)
        raw = bytearray(want.nbytes)
        t.pull(keys, out=memoryview(raw))
        assert bytes(raw) == want.tobytes()
    with fabrickv.ClusterCache(addrs, buffer_mb=4) as cc:
        blocks = [block(10 + i) for i in range(6)]
        keys_c = [f"{name}-{i}".encode() for i in range(6)]
        for k, b in zip(keys_c, blocks):
            cc.put(k, DlpackOnly(b))
        outs = [np.zeros(BLOCK_SHAPE, np.float16) for _ in blocks]
        assert cc.get_many_into(keys_c, [DlpackOnly(o) for o in outs]) == [b.nbytes for b in blocks]
        assert all(np.array_equal(o, b) for o, b in zip(outs, blocks))
        one = bytearray(blocks[0].nbytes)
        assert cc.get(keys_c[0], out=one) == blocks[0].nbytes
        assert bytes(one) == blocks[0].tobytes()

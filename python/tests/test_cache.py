"""The `fabrickv` Python module's KV-cache client against a live `fabrickv
serve`, once per native transport (tcp, where values arrive inline, and
shm, where the server writes them into the client's registered receive
buffer): values of every size and buffer type back byte for byte, reads
into caller buffers that never spill, TTLs, batches, limits with their
error codes, threads sharing a client, and the offload example run as a
user would run it.

Needs `make python` (the module in .venv) and `make build` (the server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Iterator

import numpy as np
import numpy.typing as npt
import pytest

from conftest import ROOT, TRANSPORTS, Server, listen_addr, value_bytes

try:
    import fabrickv
except ImportError as e:  # a missing build fails the run, never skips it
    pytest.fail(f"the fabrickv module is not installed ({e}): run `make python`",
                pytrace=False)

# How long a condition that should come true soon may take before the test
# fails; generous, as the machine may be busy.
DEADLINE_S = 10.0

# The cache's bound on a key (CACHE_KEY_BYTES_MAX).
KEY_BYTES_MAX = 1024

# A value's bytes travel over tcp in chunks of this many (CACHE_CHUNK_BYTES_MAX).
CHUNK_BYTES = 512 << 10

# The receive buffer of a client made without buffer_mb.
DEFAULT_BUFFER_BYTES = 64 << 20

# What a test fills an output with before a read, to see what the read wrote.
SENTINEL = 0xAB

# A small KV block: (layers, 2, heads, block, head_dim) of float16.
BLOCK_SHAPE = (2, 2, 4, 16, 32)

EXAMPLE = ROOT / "python" / "examples" / "kv_cache_offload.py"

# A test's key maker (the `key` fixture) and random generator.
Key = Callable[[str], bytes]
Rng = np.random.Generator


@pytest.fixture
def client(kv_server: Server) -> Iterator[fabrickv.CacheClient]:
    with fabrickv.CacheClient(kv_server.native, timeout=5.0) as c:
        yield c


@pytest.fixture
def key() -> Callable[[str], bytes]:
    """A fresh key prefix per test, so tests sharing a server never meet."""
    prefix = f"cache-{uuid.uuid4().hex[:16]}-".encode()
    return lambda name: prefix + name.encode()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(2024)


def random_bytes(rng: Rng, n: int) -> bytes:
    return rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()


def sentinel(n: int) -> bytearray:
    return bytearray([SENTINEL]) * n


def kv_block(rng: Rng) -> npt.NDArray[np.float16]:
    return rng.standard_normal(BLOCK_SHAPE).astype(np.float16)


def error_code(call: Callable[..., object], *args: object) -> str | None:
    """The `.code` of the fabrickv.Error `call(*args)` raises."""
    with pytest.raises(fabrickv.Error) as e:
        call(*args)
    return e.value.code


@pytest.mark.parametrize("size", [1, 100_000, 3 << 20], ids=["1B", "100KB", "3MB"])
def test_values_round_trip(client: fabrickv.CacheClient, key: Key, rng: Rng, size: int) -> None:
    value = random_bytes(rng, size)
    generation = client.put(key("v"), value)
    assert isinstance(generation, int)
    assert value_bytes(client.get(key("v"))) == value

    exact = bytearray(size)
    assert client.get_into(key("v"), exact) == size
    assert exact == value

    # A larger output gets the value at its start and keeps the rest.
    roomy = np.full(size + 100, SENTINEL, dtype=np.uint8)
    assert client.get_into(key("v"), roomy) == size
    assert roomy[:size].tobytes() == value
    assert (roomy[size:] == SENTINEL).all()


def test_get_without_out_returns_a_new_uint8_array_of_the_value(client: fabrickv.CacheClient,
                                                                key: Key, rng: Rng) -> None:
    block = kv_block(rng)
    client.put(key("block"), block)
    client.put(key("other"), b"x" * 64)
    got = client.get(key("block"))
    # A second read reuses the client's receive buffer: the first array
    # must not change, as it owns its memory.
    again = client.get(key("other"))
    assert value_bytes(got) == block.tobytes()
    assert value_bytes(again) == b"x" * 64
    assert got is not None
    np.testing.assert_array_equal(got.view(np.float16).reshape(block.shape), block)
    got[:] = 0
    assert value_bytes(client.get(key("block"))) == block.tobytes()


def test_values_are_any_contiguous_buffer_as_raw_bytes(client: fabrickv.CacheClient, key: Key,
                                                       rng: Rng) -> None:
    matrix = rng.standard_normal((3, 5)).astype(np.float32)
    backing = bytearray(random_bytes(rng, 64))
    values: dict[str, Any] = {
        "bytes": random_bytes(rng, 10),
        "bytearray": bytearray(random_bytes(rng, 10)),
        "memoryview": memoryview(random_bytes(rng, 10)),
        "contiguous slice": memoryview(backing)[8:40],
        "float32 matrix": matrix,
        "int64 scalar array": np.array(-7, dtype=np.int64),
    }
    for name, value in values.items():
        client.put(key(name), value)
    for name, value in values.items():
        assert value_bytes(client.get(key(name))) == bytes(memoryview(value).cast("B")), name


def test_get_into_a_float16_kv_block(client: fabrickv.CacheClient, key: Key, rng: Rng) -> None:
    block = kv_block(rng)
    client.put(key("block"), block)

    out = np.full(BLOCK_SHAPE, np.nan, dtype=np.float16)
    assert client.get_into(key("block"), out) == block.nbytes
    assert np.array_equal(out, block)

    # The same bytes into a bytearray read back as the same tensor.
    raw = bytearray(block.nbytes)
    assert client.get_into(key("block"), raw) == block.nbytes
    assert np.array_equal(np.frombuffer(raw, dtype=np.float16).reshape(BLOCK_SHAPE), block)

    # Into one slot of a preallocated batch of blocks (a contiguous view).
    batch = np.zeros((3,) + BLOCK_SHAPE, dtype=np.float16)
    assert client.get_into(key("block"), batch[1]) == block.nbytes
    assert np.array_equal(batch[1], block)
    assert not batch[0].any() and not batch[2].any()


@pytest.mark.parametrize("size", [1000, CHUNK_BYTES * 2 + 1], ids=["small", "chunked"])
def test_value_larger_than_out_leaves_it_untouched(client: fabrickv.CacheClient, key: Key, rng: Rng,
                                                   size: int) -> None:
    value = random_bytes(rng, size)
    client.put(key("v"), value)

    short = sentinel(size - 1)
    assert error_code(client.get_into, key("v"), short) == "BUFFER_TOO_SMALL"
    assert short == sentinel(size - 1)

    # float16 elements: one element short of the value.
    halves = np.full((size - 1) // 2, np.float16(7.0))
    assert error_code(client.get_into, key("v"), halves) == "BUFFER_TOO_SMALL"
    assert (halves == np.float16(7.0)).all()

    # An output of exactly the value's size is enough.
    exact = sentinel(size)
    assert client.get_into(key("v"), exact) == size
    assert exact == value


def test_value_larger_than_the_receive_buffer_is_refused(kv_server: Server, key: Key,
                                                         rng: Rng) -> None:
    value = random_bytes(rng, 3 << 20)
    with fabrickv.CacheClient(kv_server.native, buffer_mb=1) as small:
        assert small.buffer_size == 1 << 20
        # Stored in chunks, not through the receive buffer.
        small.put(key("big"), value)
        assert error_code(small.get, key("big")) == "BUFFER_TOO_SMALL"
        out = sentinel(len(value))
        with pytest.raises(fabrickv.Error, match="receive buffer") as e:
            small.get_into(key("big"), out)
        assert e.value.code == "BUFFER_TOO_SMALL"
        assert out == sentinel(len(value))
    with fabrickv.CacheClient(kv_server.native) as roomy:
        assert value_bytes(roomy.get(key("big"))) == value


def test_absent_key_reads_as_none(client: fabrickv.CacheClient, key: Key) -> None:
    out = sentinel(16)
    assert client.get(key("absent")) is None
    assert client.get_into(key("absent"), out) is None
    assert out == sentinel(16)
    assert client.exists(key("absent")) is False


def test_ttl_expires_the_value(client: fabrickv.CacheClient, key: Key) -> None:
    ttl_s = 0.05
    start = time.monotonic()
    client.put(key("short"), b"soon gone", ttl=ttl_s)
    client.put_many([(key("batch"), b"also gone")], ttl=ttl_s)
    client.put(key("forever"), b"stays")
    # Wait for the expiry by polling, with a deadline.
    deadline = start + DEADLINE_S
    while client.exists(key("short")) or client.exists(key("batch")):
        assert time.monotonic() < deadline, "a value outlived its TTL"
        time.sleep(0.01)
    # The server counts the TTL from when it stored the value, which is
    # after `start`: the value cannot have gone before the TTL ran out.
    assert time.monotonic() - start >= ttl_s
    assert client.get(key("short")) is None
    assert client.get_into(key("batch"), bytearray(16)) is None
    assert value_bytes(client.get(key("forever"))) == b"stays"


def test_ttl_is_not_applied_early(client: fabrickv.CacheClient, key: Key) -> None:
    client.put(key("long"), b"v", ttl=3600)
    assert value_bytes(client.get(key("long"))) == b"v"


def test_put_many_then_get_many_into_with_an_absent_key_between(client: fabrickv.CacheClient,
                                                                key: Key, rng: Rng) -> None:
    block = kv_block(rng)
    tail = random_bytes(rng, 300_000)
    generations = client.put_many([(key("a"), block), (key("c"), tail)])
    assert len(generations) == 2 and all(isinstance(g, int) for g in generations)

    out_a = np.zeros(BLOCK_SHAPE, dtype=np.float16)
    out_b = sentinel(64)
    out_c = bytearray(len(tail) + 10)
    got = client.get_many_into([key("a"), key("b"), key("c")], [out_a, out_b, out_c])
    assert got == [block.nbytes, None, len(tail)]
    assert np.array_equal(out_a, block)
    assert out_b == sentinel(64)
    assert out_c[:len(tail)] == tail


def test_get_many_into_more_than_the_receive_buffer_holds(kv_server: Server, key: Key,
                                                          rng: Rng) -> None:
    # Seven 300 KB outputs do not fit a 1 MiB receive buffer side by side:
    # the batch is read in rounds, each value into its own output.
    values = [random_bytes(rng, 300_000 + i) for i in range(7)]
    keys = [key(f"v{i}") for i in range(len(values))]
    with fabrickv.CacheClient(kv_server.native, buffer_mb=1) as c:
        c.put_many(list(zip(keys, values)))
        outs = [bytearray(len(v)) for v in values]
        assert c.get_many_into(keys, outs) == [len(v) for v in values]
        assert outs == [bytearray(v) for v in values]


def test_get_many_into_refuses_an_output_too_small(client: fabrickv.CacheClient, key: Key,
                                                   rng: Rng) -> None:
    values = [random_bytes(rng, 1000) for _ in range(3)]
    keys = [key(f"v{i}") for i in range(3)]
    client.put_many(list(zip(keys, values)))
    outs = [bytearray(1000), sentinel(999), sentinel(1000)]
    with pytest.raises(fabrickv.Error, match="key 1") as e:
        client.get_many_into(keys, outs)
    assert e.value.code == "BUFFER_TOO_SMALL"
    # The failing key's output and the later ones are untouched.
    assert outs[1] == sentinel(999)
    assert outs[2] == sentinel(1000)


def test_rewriting_a_key_changes_its_generation(client: fabrickv.CacheClient, key: Key) -> None:
    first = client.put(key("k"), b"one")
    second = client.put(key("k"), b"two")
    assert second != first
    assert value_bytes(client.get(key("k"))) == b"two"


def test_delete_and_exists(client: fabrickv.CacheClient, key: Key) -> None:
    client.put(key("k"), b"v")
    assert client.exists(key("k")) is True
    assert client.delete(key("k")) is True
    assert client.exists(key("k")) is False
    assert client.get(key("k")) is None
    assert client.delete(key("k")) is False


def test_str_keys_are_their_utf8_bytes(client: fabrickv.CacheClient, key: Key) -> None:
    name = key("ключ").decode()
    client.put(name, b"v")
    assert value_bytes(client.get(name.encode())) == b"v"
    assert client.exists(name) is True


def test_key_length_limits(client: fabrickv.CacheClient, key: Key) -> None:
    longest = key("").ljust(KEY_BYTES_MAX, b"k")
    client.put(longest, b"v")
    assert value_bytes(client.get(longest)) == b"v"

    too_long = longest + b"k"
    out = bytearray(4)
    calls: list[tuple[Callable[..., object], tuple[object, ...]]] = [
        (client.put, (too_long, b"v")),
        (client.put_many, ([(too_long, b"v")],)),
        (client.get, (too_long,)),
        (client.get_into, (too_long, out)),
        (client.get_many_into, ([too_long], [out])),
        (client.exists, (too_long,)),
        (client.delete, (too_long,)),
    ]
    for call, args in calls:
        assert error_code(call, *args) == "KEY_TOO_LONG", call
    assert error_code(client.put, b"", b"v") == "MALFORMED"


def test_wrong_arguments_raise_python_errors(client: fabrickv.CacheClient, key: Key) -> None:
    with pytest.raises(TypeError):
        client.put(7, b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.put(key("k"), 7)
    with pytest.raises(TypeError, match="read-only"):
        client.get_into(key("k"), b"immutable")
    with pytest.raises(ValueError, match="contiguous"):
        client.put(key("k"), np.zeros((4, 4))[:, ::2])
    with pytest.raises(ValueError, match="contiguous"):
        client.get_into(key("k"), np.zeros((4, 4)).T)
    for ttl in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            client.put(key("k"), b"v", ttl=ttl)
    with pytest.raises(ValueError, match="2 keys but 1 outs"):
        client.get_many_into([key("a"), key("b")], [bytearray(1)])
    # None of the refused puts stored anything.
    assert client.exists(key("k")) is False


def test_buffer_and_transport_properties(kv_server: Server, client: fabrickv.CacheClient) -> None:
    assert client.one_sided is (kv_server.transport == "shm")
    assert client.buffer_size == DEFAULT_BUFFER_BYTES
    with fabrickv.CacheClient(kv_server.native, buffer_mb=2) as c:
        assert c.buffer_size == 2 << 20
        assert kv_server.native in repr(c)
    for bad in (0, -1, 1 << 20):
        with pytest.raises(ValueError, match="buffer_mb"):
            fabrickv.CacheClient(kv_server.native, buffer_mb=bad)


def test_closed_client_refuses_calls(kv_server: Server, key: Key) -> None:
    with fabrickv.CacheClient(kv_server.native) as c:
        c.put(key("k"), b"v")
        assert not c.closed
    assert c.closed
    assert error_code(c.get, key("k")) == "UNAVAILABLE"
    assert error_code(c.put, key("k"), b"v") == "UNAVAILABLE"
    c.close()  # twice is harmless


def test_one_client_shared_by_threads(client: fabrickv.CacheClient, key: Key) -> None:
    # Every read goes through the one receive buffer: the calls of threads
    # sharing a client take turns, and none gets another's value.
    errors = []

    def worker(n: int) -> None:
        try:
            out = bytearray(4096)
            for i in range(100):
                k = key(f"t{n}-{i}")
                value = k * (1 + (n * 7 + i) % 50)
                client.put(k, value)
                assert client.get_into(k, out) == len(value)
                assert out[:len(value)] == value
                assert client.get_many_into([k, key("absent")], [out, out]) == [len(value), None]
                assert value_bytes(client.get(k)) == value
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    assert errors == []


def freeze(pid: int) -> None:
    """SIGSTOPs `pid` and returns once every thread of it has stopped (the
    signal takes effect after kill() returns)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + DEADLINE_S
    task_dir = f"/proc/{pid}/task"
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(task_dir):
            try:
                with open(f"{task_dir}/{tid}/stat") as f:
                    # The state follows the parenthesised command name.
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                continue
        if states and all(st in ("T", "t") for st in states):
            return
        time.sleep(0.001)
    pytest.fail(f"process {pid} did not stop within {DEADLINE_S}s")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_calls_waiting_on_a_stopped_server_release_the_gil(transport: str) -> None:
    # Clients whose server is frozen wait out their timeout together, not
    # in turn: each wait runs with the GIL released.
    timeout_s, threads = 1.0, 4
    server = Server(listen=listen_addr(transport))
    clients = [fabrickv.CacheClient(server.native, buffer_mb=1, timeout=timeout_s)
               for _ in range(threads)]
    codes = []

    def call(c: fabrickv.CacheClient) -> None:
        try:
            c.get_into(b"k", bytearray(16))
        except fabrickv.Error as e:
            codes.append(e.code)

    freeze(server.proc.pid)
    try:
        start = time.monotonic()
        ts = [threading.Thread(target=call, args=(c,)) for c in clients]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=DEADLINE_S)
        took = time.monotonic() - start
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        for c in clients:
            c.close()
        server.stop()
    assert codes == ["TIMEOUT"] * threads
    assert took < 2.5 * timeout_s, f"{threads} waiting calls took {took:.2f}s: run in turn"


def test_the_offload_example_reloads_its_blocks(kv_server: Server) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), kv_server.native, "--blocks", "6", "--new-blocks", "2"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("offload blocks=6 ") and "reused=6 recomputed=2" in last, last
    assert f"one_sided={kv_server.transport == 'shm'}" in last, last

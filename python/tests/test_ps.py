"""The `fabrickv` Python module's embedding tables against a live `fabrickv
serve`, once per native transport (tcp, and shm where pulls land
one-sided in a registered region): tables made, opened and listed; pulls
that return exactly what was put, in request order; the optimizers'
arithmetic; outstanding pulls; argument errors; and the training-loop
example run as a user would run it.

Needs `make python` (the module in .venv) and `make build` (the server)."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Iterator

import numpy as np
import numpy.typing as npt
import pytest

from conftest import ROOT, Server

try:
    import fabrickv
except ImportError as e:  # a missing build fails the run, never skips it
    pytest.fail(f"the fabrickv module is not installed ({e}): run `make python`",
                pytrace=False)

# How long a condition that should come true soon may take before the test
# fails; generous, as the machine may be busy.
DEADLINE_S = 10.0

# Keys one PULL or PUSH request carries (PS_KEYS_PER_REQUEST_MAX); larger
# calls are split by the client.
KEYS_PER_REQUEST_MAX = 512

# The initializer's half-range (INIT_RANGE in crates/wire/src/ps.rs).
INIT_RANGE = 0.01

# Adagrad's constants on the server (crates/server/src/ps.rs).
ADAGRAD_INITIAL_ACCUMULATOR = np.float32(0.1)
ADAGRAD_EPSILON = np.float32(1e-10)

# Pulls one client keeps outstanding (PS_OUTSTANDING_PULLS_MAX).
OUTSTANDING_PULLS_MAX = 256

EXAMPLE = ROOT / "python" / "examples" / "train_embedding.py"


@pytest.fixture
def client(ps_server: Server) -> Iterator[fabrickv.Client]:
    with fabrickv.Client(ps_server.native, timeout=5.0) as c:
        yield c


@pytest.fixture
def name() -> str:
    """A fresh table name per test, so tests sharing a server never meet."""
    return f"t-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


def keys_of(*ks: int) -> npt.NDArray[np.uint64]:
    return np.array(ks, dtype=np.uint64)


def test_create_open_and_list(client: fabrickv.Client, name: str) -> None:
    t = client.create_table(name, dim=128, optimizer="adagrad", lr=0.5,
                            missing="init", seed=7)
    assert (t.name, t.dim, t.optimizer, t.missing, t.seed) == (name, 128, "adagrad", "init", 7)
    assert t.lr == pytest.approx(0.5)
    assert t.id > 0
    assert name in repr(t)

    opened = client.table(name)
    assert (opened.id, opened.dim, opened.optimizer) == (t.id, 128, "adagrad")
    # Creating it again with the same shape opens it.
    assert client.create_table(name, dim=128, optimizer="adagrad", lr=0.5,
                               missing="init", seed=7).id == t.id

    t.put(keys_of(1, 2, 3), np.zeros((3, 128), dtype=np.float32))
    listed = {d["name"]: d for d in client.tables()}
    assert listed[name] == {"name": name, "id": t.id, "dim": 128, "optimizer": "adagrad",
                            "lr": pytest.approx(0.5), "missing": "init", "seed": 7,
                            "items": 3}
    assert len(t) == 3

    # Defaults: sgd, zeros for absent keys.
    d = client.create_table(name + "-d", dim=4)
    assert (d.optimizer, d.missing, d.seed) == ("sgd", "zeros", 0)


def test_unknown_tables_and_bad_specs(client: fabrickv.Client, name: str) -> None:
    with pytest.raises(fabrickv.Error) as e:
        client.table(name)
    assert e.value.code == "NO_SUCH_TABLE"
    with pytest.raises(fabrickv.Error) as e:
        client.create_table(name, dim=0)
    assert e.value.code == "BAD_DIMENSION"
    with pytest.raises(ValueError, match="optimizer"):
        client.create_table(name, dim=4, optimizer="adam")
    with pytest.raises(ValueError, match="missing"):
        client.create_table(name, dim=4, missing="random")
    with pytest.raises(ValueError, match="dim"):
        client.create_table(name, dim=-1)
    with pytest.raises(ValueError, match="lr"):
        client.create_table(name, dim=4, lr=float("nan"))


def test_pull_returns_what_was_put_in_request_order(client: fabrickv.Client, name: str,
                                                    rng: np.random.Generator) -> None:
    t = client.create_table(name, dim=8)
    keys = keys_of(10, 20, 30, 40)
    values = rng.standard_normal((4, 8)).astype(np.float32)
    t.put(keys, values)

    asked = keys_of(30, 99, 10, 40, 7, 20, 30)
    got, found = t.pull(asked, return_found=True)
    assert got.dtype == np.float32 and got.shape == (7, 8)
    assert found.dtype == np.bool_ and found.tolist() == [True, False, True, True,
                                                          False, True, True]
    by_key = dict(zip(keys.tolist(), values))
    for row, k in zip(got, asked.tolist()):
        np.testing.assert_array_equal(row, by_key.get(k, np.zeros(8, np.float32)))
    # Without return_found: the array alone, the same values.
    np.testing.assert_array_equal(t.pull(asked), got)

    # put overwrites.
    t.put(keys_of(20), np.full(8, 2.5, dtype=np.float32))
    np.testing.assert_array_equal(t.pull(keys_of(20))[0], np.full(8, 2.5, np.float32))


def test_pulled_arrays_belong_to_the_caller(client: fabrickv.Client, name: str) -> None:
    t = client.create_table(name, dim=4)
    t.put(keys_of(1), np.ones(4, dtype=np.float32))
    a = t.pull(keys_of(1, 1))
    assert a.flags.c_contiguous and a.flags.writeable
    a[:] = 7.0
    np.testing.assert_array_equal(t.pull(keys_of(1)), np.ones((1, 4), np.float32))
    # No keys: an empty (0, dim) array, no error.
    assert t.pull(np.array([], dtype=np.uint64)).shape == (0, 4)
    assert t.pull([]).shape == (0, 4)


def test_calls_of_more_keys_than_one_request_holds(client: fabrickv.Client, name: str,
                                                   rng: np.random.Generator) -> None:
    n = 3 * KEYS_PER_REQUEST_MAX + 77
    t = client.create_table(name, dim=32, optimizer="sgd", lr=0.25)
    keys = rng.permutation(np.arange(1, n + 1, dtype=np.uint64))
    values = rng.standard_normal((n, 32)).astype(np.float32)
    t.put(keys, values)
    np.testing.assert_array_equal(t.pull(keys), values)
    back = keys[::-1].copy()
    np.testing.assert_array_equal(t.pull(back), values[::-1])
    grads = rng.standard_normal((n, 32)).astype(np.float32)
    t.push(keys, grads)
    np.testing.assert_allclose(t.pull(keys), values - np.float32(0.25) * grads,
                               rtol=1e-6, atol=1e-7)
    assert len(t) == n


def test_missing_init_returns_the_deterministic_initializer(
        client: fabrickv.Client, name: str) -> None:
    t = client.create_table(name, dim=64, missing="init", seed=3)
    keys = keys_of(1, 2, 3, 1000003)
    first, found = t.pull(keys, return_found=True)
    second, found2 = t.pull(keys, return_found=True)
    np.testing.assert_array_equal(first, second)
    assert not found.any() and not found2.any(), "a pull inserts nothing"
    assert ((first >= -INIT_RANGE) & (first < INIT_RANGE)).all()
    assert len(np.unique(first)) > 1, "not a constant"
    assert not np.array_equal(first[0], first[1]), "keys differ"

    other = client.create_table(name + "-s", dim=64, missing="init", seed=4)
    assert not np.array_equal(other.pull(keys), first), "the seed matters"

    # A gradient pushed to an absent key applies to the initializer.
    g = np.full((1, 64), 0.5, dtype=np.float32)
    t.push(keys[:1], g)
    after, found = t.pull(keys[:1], return_found=True)
    assert found.all()
    np.testing.assert_allclose(after, first[:1] - np.float32(t.lr) * g, rtol=1e-6, atol=1e-8)


def test_sgd_push_applies_w_minus_lr_g(
        client: fabrickv.Client, name: str, rng: np.random.Generator) -> None:
    t = client.create_table(name, dim=16, optimizer="sgd", lr=0.1)
    lr = np.float32(t.lr)
    keys = keys_of(5, 6, 7)
    w = rng.standard_normal((3, 16)).astype(np.float32)
    t.put(keys, w)
    for _ in range(3):
        g = rng.standard_normal((3, 16)).astype(np.float32)
        t.push(keys, g)
        w = w - lr * g
        np.testing.assert_allclose(t.pull(keys), w, rtol=1e-6, atol=1e-7)
    # A zero gradient changes nothing.
    t.push(keys_of(5), np.zeros((1, 16), dtype=np.float32))
    np.testing.assert_allclose(t.pull(keys_of(5)), w[:1], rtol=1e-6, atol=1e-7)


def test_adagrad_push_follows_its_formula(client: fabrickv.Client, name: str,
                                          rng: np.random.Generator) -> None:
    t = client.create_table(name, dim=16, optimizer="adagrad", lr=0.5)
    lr = np.float32(t.lr)
    keys = keys_of(11, 12)
    # Typed loosely: the dtype the arithmetic keeps is what is asserted.
    w: npt.NDArray[Any] = rng.standard_normal((2, 16)).astype(np.float32)
    t.put(keys, w)  # an overwrite resets the accumulator
    acc = np.full((2, 16), ADAGRAD_INITIAL_ACCUMULATOR, dtype=np.float32)
    for _ in range(4):
        g = rng.standard_normal((2, 16)).astype(np.float32)
        t.push(keys, g)
        acc = acc + g * g
        w = w - lr * g / (np.sqrt(acc) + ADAGRAD_EPSILON)
        assert w.dtype == np.float32
        np.testing.assert_allclose(t.pull(keys), w, rtol=1e-5, atol=1e-7)
    # Overwriting resets the accumulator: the next step is as large as a
    # first one.
    t.put(keys, w)
    g = np.ones((2, 16), dtype=np.float32)
    t.push(keys, g)
    first_step = lr * g / (np.sqrt(ADAGRAD_INITIAL_ACCUMULATOR + g * g) + ADAGRAD_EPSILON)
    np.testing.assert_allclose(t.pull(keys), w - first_step, rtol=1e-5, atol=1e-7)


def wait_until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {DEADLINE_S} s"
        time.sleep(0.001)


def test_pull_async_several_in_flight_waited_out_of_order(client: fabrickv.Client, name: str,
                                                          rng: np.random.Generator) -> None:
    t = client.create_table(name, dim=32)
    keys = np.arange(1, 2001, dtype=np.uint64)
    values = rng.standard_normal((2000, 32)).astype(np.float32)
    t.put(keys, values)

    batches = [rng.choice(keys, size=s, replace=False) for s in (1, 100, 700, 37, 512)]
    handles = [t.pull_async(b) for b in batches]
    assert "pending" in repr(handles[0]) and len(handles[2]) == 700
    wait_until(handles[3].done, "an outstanding pull completes")
    assert handles[3].done(), "done stays true until waited on"
    for i in (3, 0, 4, 2, 1):
        got = handles[i].wait()
        assert got.shape == (len(batches[i]), 32)
        np.testing.assert_array_equal(got, values[batches[i].astype(np.int64) - 1])
        assert "waited" in repr(handles[i])

    # return_found given to pull_async: wait gives the pair.
    h = t.pull_async(keys_of(1, 5000), return_found=True)
    got, found = h.wait()
    assert found.tolist() == [True, False]
    np.testing.assert_array_equal(got[0], values[0])

    # A handle is spent once waited on or cancelled.
    for method in ("wait", "done", "cancel"):
        with pytest.raises(fabrickv.Error) as e:
            getattr(h, method)()
        assert e.value.code == "MALFORMED"
    c = t.pull_async(keys)
    c.cancel()
    assert "cancelled" in repr(c)
    for method in ("wait", "done", "cancel"):
        with pytest.raises(fabrickv.Error) as e:
            getattr(c, method)()
        assert e.value.code == "MALFORMED"
    # The connection is still in step after the cancel.
    np.testing.assert_array_equal(t.pull(keys[:3]), values[:3])


def test_dropped_handles_cancel_their_pulls(client: fabrickv.Client, name: str) -> None:
    t = client.create_table(name, dim=8)
    t.put(keys_of(1), np.ones((1, 8), dtype=np.float32))
    # More than the client keeps outstanding: had dropping not cancelled
    # them, each later pull_async would have to wait one out.
    for _ in range(2 * OUTSTANDING_PULLS_MAX):
        t.pull_async(keys_of(1, 2, 3))
    gc.collect()
    np.testing.assert_array_equal(t.pull(keys_of(1)), np.ones((1, 8), np.float32))
    h = t.pull_async(keys_of(1))
    np.testing.assert_array_equal(h.wait(), np.ones((1, 8), np.float32))


def test_tables_share_the_clients_connection_across_threads(
        client: fabrickv.Client, name: str) -> None:
    t = client.create_table(name, dim=16)
    keys = np.arange(1, 201, dtype=np.uint64)
    values = np.arange(200 * 16, dtype=np.float32).reshape(200, 16)
    t.put(keys, values)
    other = client.table(name)
    errors = []

    def work(table: fabrickv.Table, seed: int) -> None:
        try:
            r = np.random.default_rng(seed)
            for _ in range(200):
                b = r.choice(keys, size=20)
                np.testing.assert_array_equal(table.pull(b), values[b.astype(np.int64) - 1])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(tb, i))
               for i, tb in enumerate((t, other, t, other))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(DEADLINE_S)
    assert not any(th.is_alive() for th in threads)
    assert errors == []


def test_keys_and_values_of_other_types(client: fabrickv.Client, name: str) -> None:
    t = client.create_table(name, dim=4)
    # Python ints, int64 arrays, non-contiguous views, float64 values,
    # nested lists and Fortran-ordered arrays are converted.
    t.put([1, 2], [[1, 2, 3, 4], [5, 6, 7, 8]])
    t.put(np.array([3], dtype=np.int64), np.array([9, 10, 11, 12], dtype=np.float64))
    fortran = np.asfortranarray(np.arange(8, dtype=np.float32).reshape(2, 4))
    t.put(np.array([4, 0, 5], dtype=np.uint64)[::2], fortran)
    got = t.pull(np.array([1, 9, 2, 9, 3, 9, 4, 9, 5], dtype=np.uint64)[::2])
    np.testing.assert_array_equal(got, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12],
                                        [0, 1, 2, 3], [4, 5, 6, 7]])
    # The whole u64 range, from a list numpy alone would make float64.
    top = 2**64 - 1
    t.put([top, 0], np.ones((2, 4)))
    np.testing.assert_array_equal(t.pull([0, top]), np.ones((2, 4), np.float32))
    # Big-endian keys are keys all the same.
    np.testing.assert_array_equal(t.pull(np.array([1], dtype=">u8")), [[1, 2, 3, 4]])


def test_shape_and_type_errors(client: fabrickv.Client, name: str) -> None:
    t = client.create_table(name, dim=4)
    with pytest.raises(ValueError, match=r"expected shape \(2, 4\) or \(8,\).*got \(2, 3\)"):
        t.put(keys_of(1, 2), np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"grads: expected shape \(2, 4\).*got \(7,\)"):
        t.push(keys_of(1, 2), np.zeros(7, dtype=np.float32))
    with pytest.raises(ValueError, match=r"got \(1, 2, 4\)"):
        t.put(keys_of(1), np.zeros((1, 2, 4), dtype=np.float32))
    with pytest.raises(TypeError, match="float32"):
        t.put(keys_of(1), np.array(["a", "b", "c", "d"]))
    with pytest.raises(ValueError, match="non-negative"):
        t.pull([3, -1])
    with pytest.raises(ValueError, match="outside"):
        t.pull([2**64])
    with pytest.raises(ValueError, match="outside"):
        t.pull([-1, 2**63])
    with pytest.raises(TypeError, match="integers"):
        t.pull([1.5])
    with pytest.raises(TypeError, match="integers"):
        t.pull(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="integers"):
        t.pull(np.array([True]))
    with pytest.raises(TypeError, match="integers"):
        t.pull(["key"])
    with pytest.raises(ValueError, match="1-D"):
        t.pull(np.zeros((2, 2), dtype=np.uint64))
    with pytest.raises(ValueError, match="1-D"):
        t.pull(7)
    with pytest.raises(ValueError, match="non-negative"):
        t.pull_async([-5])
    # Nothing was written by the refused calls.
    assert len(t) == 0


def test_a_closed_client_refuses_table_calls(ps_server: Server, name: str) -> None:
    c = fabrickv.Client(ps_server.native)
    t = c.create_table(name, dim=4)
    h = t.pull_async(keys_of(1))
    c.close()
    for call in (lambda: t.pull(keys_of(1)), c.tables, h.wait,
                 lambda: t.put(keys_of(1), np.zeros(4))):
        with pytest.raises(fabrickv.Error) as e:
            call()
        assert e.value.code == "UNAVAILABLE"
    del h  # dropping a handle of a closed client is harmless
    gc.collect()


def test_the_training_example_lowers_its_loss(ps_server: Server, name: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), ps_server.native, "--table", name, "--steps", "200"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"final loss_start=(\S+) loss_end=(\S+)", last)
    assert m, f"unexpected last line {last!r}"
    start, end = float(m.group(1)), float(m.group(2))
    assert end < start / 10, f"the loss fell from {start} to only {end}"

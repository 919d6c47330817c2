"""The `fabrickv` Python module's cluster clients against three live
`fabrickv serve` processes, once per native transport (tcp, shm): key-value
batches split by server and merged in request order, embedding tables whose
rows live on their keys' servers, the KV cache across the cluster, a down
server named in the error while the others go on working, and the memcached
registry (servers found by cluster name, processes meeting at a barrier).

Needs `make python` (the module in .venv), `make build` (the server) and
memcached (`make deps`) for the registry tests."""

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from conftest import (PS_POOL_ARGS, ROOT, Memcached, Server, listen_addr, start_servers,
                      stop_all, value_bytes)

try:
    import fabrickv
except ImportError as e:  # a missing build fails the run, never skips it
    pytest.fail(f"the fabrickv module is not installed ({e}): run `make python`",
                pytrace=False)

# The timeout of the down-server test: a call needing the dead server must
# fail within about this.
DOWN_TIMEOUT_S = 1.0


@pytest.fixture
def cluster(cluster_servers: list[Server]) -> Iterator[fabrickv.Cluster]:
    transport = cluster_servers[0].transport
    with fabrickv.Cluster([s.native for s in cluster_servers], transport=transport,
                          timeout=5.0) as c:
        yield c


@pytest.fixture
def name() -> str:
    """A fresh table or key prefix per test, so tests sharing servers never
    meet."""
    return f"t-{uuid.uuid4().hex[:16]}"


def test_mput_and_mget_across_the_cluster_in_request_order(
        cluster: fabrickv.Cluster, cluster_servers: list[Server], name: str) -> None:
    keys = [f"{name}-{i}".encode() for i in range(500)]
    values = [f"value-{i}-".encode() * (1 + i % 7) for i in range(500)]
    cluster.mput(keys, values)
    assert cluster.mget(keys) == values
    # A shuffled order, absent keys among them, comes back in that order.
    order = list(reversed(keys)) + [b"absent-" + name.encode()]
    assert cluster.mget(order) == list(reversed(values)) + [None]

    # Every key is on the server the cluster says owns it, and on no other;
    # the keys are spread over all three.
    owners = [cluster.server_of(k) for k in keys]
    assert set(owners) == {0, 1, 2}
    for sid, s in enumerate(cluster_servers):
        with fabrickv.Client(s.native) as one:
            got = one.mget(keys)
        for k, v, owner, g in zip(keys, values, owners, got):
            assert g == (v if owner == sid else None), (k, sid, owner)

    assert cluster.get(keys[3]) == values[3]
    cluster.put(keys[3], b"new", ttl=60)
    assert cluster.get(keys[3]) == b"new"
    assert cluster.delete(keys[3]) is True
    assert cluster.delete(keys[3]) is False
    assert cluster.mdelete(keys[:3] + [keys[3]]) == [True, True, True, False]
    assert cluster.mget(keys[:4]) == [None] * 4
    cluster.mput({keys[0]: b"a", keys[1]: b"b"})
    cluster.mput([(keys[2], b"c")])
    assert cluster.mget(keys[:3]) == [b"a", b"b", b"c"]

    assert (cluster.size, len(cluster), cluster.name) == (3, 3, "default")
    assert all(cluster.is_up(i) for i in range(3))
    assert [cluster.addr(i) for i in range(3)] == [s.native for s in cluster_servers]
    stats = cluster.stats()
    assert len(stats) == 3 and all(st is not None and st["items"] > 0 for st in stats)
    with pytest.raises(ValueError):
        cluster.is_up(3)


def test_tables_across_the_cluster(cluster: fabrickv.Cluster, cluster_servers: list[Server],
                                   name: str) -> None:
    dim = 8
    t = cluster.create_table(name, dim=dim, optimizer="sgd", lr=0.5)
    assert (t.name, t.dim) == (name, dim)
    keys = np.arange(1000, 1300, dtype=np.uint64)
    assert {cluster.server_of(int(k)) for k in keys} == {0, 1, 2}
    rows = np.random.default_rng(7).standard_normal((len(keys), dim)).astype(np.float32)
    t.put(keys, rows)

    # A pull in request order, into a new array and into the caller's.
    np.testing.assert_array_equal(t.pull(keys), rows)
    order = keys[::-1].copy()
    out = np.empty((len(keys), dim), dtype=np.float32)
    got = t.pull(order, out=out)
    assert got is out
    np.testing.assert_array_equal(out, rows[::-1])
    flat = np.empty(len(keys) * dim, dtype=np.float32)
    t.pull(keys, out=flat)
    np.testing.assert_array_equal(flat, rows.ravel())

    # Absent keys are zeros, and `found` says which the table held.
    values, found = t.pull([int(keys[0]), 5, int(keys[1])], return_found=True)
    assert found.tolist() == [True, False, True]
    np.testing.assert_array_equal(values[1], np.zeros(dim, np.float32))

    # sgd: row -= lr * grad, on each key's server.
    grads = np.ones((len(keys), dim), dtype=np.float32)
    t.push(keys, grads)
    np.testing.assert_allclose(t.pull(keys), rows - 0.5 * grads, rtol=1e-6)

    # The rows live on their owners: each server holds its share.
    listed = {d["name"]: d for d in cluster.tables()}[name]
    assert listed["items"] == len(keys) == len(t)
    owners = np.array([cluster.server_of(int(k)) for k in keys])
    assert listed["items_per_server"] == [int((owners == s).sum()) for s in range(3)]
    opened = cluster.table(name)
    np.testing.assert_array_equal(opened.pull(keys[:5]), t.pull(keys[:5]))

    with pytest.raises(ValueError, match="expected shape"):
        t.put(keys, rows[:, :4])
    with pytest.raises(ValueError, match="expected shape"):
        t.pull(keys, out=np.empty((len(keys), dim + 1), np.float32))
    with pytest.raises(TypeError):
        t.pull(keys, out=np.empty((len(keys), dim), np.float64))
    with pytest.raises(fabrickv.Error) as e:
        cluster.table(f"{name}-absent")
    assert e.value.code == "NO_SUCH_TABLE"


def test_cache_across_the_cluster(cluster_servers: list[Server], name: str) -> None:
    with fabrickv.ClusterCache([s.native for s in cluster_servers], buffer_mb=1,
                               transport=cluster_servers[0].transport) as cache:
        keys = [f"{name}-{i}" for i in range(30)]
        blocks = [np.full(1000 + i, i, dtype=np.uint8) for i in range(30)]
        for k, b in zip(keys, blocks):
            cache.put(k, b)
        assert {cache.server_of(k) for k in keys} == {0, 1, 2}
        for k, b in zip(keys, blocks):
            assert value_bytes(cache.get(k)) == b.tobytes()
            out = bytearray(2000)
            assert cache.get_into(k, out) == len(b)
            assert bytes(out[:len(b)]) == b.tobytes()
        small = bytearray(10)
        with pytest.raises(fabrickv.Error) as e:
            cache.get_into(keys[0], small)
        assert e.value.code == "BUFFER_TOO_SMALL"
        assert small == bytearray(10)
        assert cache.exists(keys[0]) and cache.delete(keys[0])
        assert not cache.exists(keys[0]) and cache.get(keys[0]) is None


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_down_server_is_named_and_the_others_go_on(transport: str, name: str) -> None:
    servers = start_servers(3, transport)
    try:
        c = fabrickv.Cluster([s.native for s in servers], transport=transport,
                             timeout=DOWN_TIMEOUT_S)
        keys = [f"{name}-{i}".encode() for i in range(60)]
        c.mput([(k, k) for k in keys])
        t = c.create_table(name, dim=4)
        int_keys = np.arange(60, dtype=np.uint64)
        t.put(int_keys, np.ones((60, 4), np.float32))

        servers[1].stop()
        dead = [k for k in keys if c.server_of(k) == 1]
        live = [k for k in keys if c.server_of(k) != 1]
        assert dead and live
        with pytest.raises(fabrickv.Error) as e:
            c.mget(keys)
        assert e.value.code in ("UNAVAILABLE", "TIMEOUT"), e.value
        assert "server 1" in str(e.value)
        assert c.mget(live) == live
        with pytest.raises(fabrickv.Error) as e:
            c.get(dead[0])
        assert e.value.code in ("UNAVAILABLE", "TIMEOUT") and "server 1" in str(e.value)

        # Tables: the live servers' rows still pull; the dead one's fail.
        live_ints = np.array([k for k in int_keys if c.server_of(int(k)) != 1], np.uint64)
        dead_ints = np.array([k for k in int_keys if c.server_of(int(k)) == 1], np.uint64)
        assert len(live_ints) and len(dead_ints)
        np.testing.assert_array_equal(t.pull(live_ints), np.ones((len(live_ints), 4)))
        with pytest.raises(fabrickv.Error) as e:
            t.pull(int_keys)
        assert e.value.code in ("UNAVAILABLE", "TIMEOUT") and "server 1" in str(e.value)
        stats = c.stats()
        assert stats[1] is None and stats[0] is not None and stats[2] is not None
        c.close()
    finally:
        stop_all(servers)


def test_servers_found_through_the_registry(memcached: Memcached, name: str) -> None:
    cluster_name = f"c-{uuid.uuid4().hex[:12]}"
    servers = []
    try:
        for i in range(3):
            servers.append(Server(*PS_POOL_ARGS,
                                  "--registry", memcached.url, "--cluster", cluster_name,
                                  "--id", str(i), "--cluster-size", "3",
                                  listen=listen_addr("tcp"), workers=1))
        found = fabrickv.lookup(memcached.url, cluster_name, wait=5.0)
        descs = [d for d in found if d is not None]
        assert [d["id"] for d in descs] == [0, 1, 2]
        assert [d["addrs"][0] for d in descs] == [s.native for s in servers]
        assert all(d["workers"] == 1 for d in descs)

        with fabrickv.Cluster(registry=memcached.url, name=cluster_name) as c:
            assert c.size == 3 and c.name == cluster_name
            keys = [f"{name}-{i}".encode() for i in range(100)]
            c.mput(keys, keys)
            assert c.mget(keys) == keys
            t = c.create_table(name, dim=2)
            t.put([1, 2, 3], np.ones((3, 2), np.float32))
            np.testing.assert_array_equal(t.pull([3, 2, 1]), np.ones((3, 2)))
    finally:
        stop_all(servers)
    with pytest.raises(fabrickv.Error) as e:
        fabrickv.lookup(memcached.url, f"none-{cluster_name}")
    assert e.value.code in ("TIMEOUT", "UNAVAILABLE", "MALFORMED")


BARRIER_CHILD = """
import sys, fabrickv
print(fabrickv.barrier(sys.argv[1], sys.argv[2], 3, cluster=sys.argv[3], timeout=20.0))
"""


def test_processes_meet_at_a_barrier(memcached: Memcached) -> None:
    name = f"b-{uuid.uuid4().hex[:12]}"
    procs = [subprocess.Popen([sys.executable, "-c", BARRIER_CHILD, memcached.url, name, "py"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(3)]
    orders = []
    for p in procs:
        out, _ = p.communicate(timeout=30)
        assert p.returncode == 0
        orders.append(int(out))
    assert sorted(orders) == [1, 2, 3]

    # A barrier nobody else reaches times out, saying how many arrived.
    with pytest.raises(fabrickv.Error) as e:
        fabrickv.barrier(memcached.url, f"{name}-alone", 2, cluster="py", timeout=0.2)
    assert e.value.code == "TIMEOUT"
    assert "1 of 2" in str(e.value)


def test_exactly_one_source_is_given() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        fabrickv.Cluster()
    with pytest.raises(ValueError, match="exactly one"):
        fabrickv.Cluster(["127.0.0.1:1"], registry="memcached://127.0.0.1:1")


def test_a_static_cluster_file(cluster_servers: list[Server], tmp_path: Path, name: str) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text('name = "static"\n' + "".join(
        f'[[server]]\nid = {i}\naddrs = ["{s.native}"]\n' for i, s in enumerate(cluster_servers)))
    with fabrickv.Cluster(config=str(config)) as c:
        assert (c.name, c.size) == ("static", 3)
        keys = [f"{name}-{i}".encode() for i in range(50)]
        c.mput(keys, keys)
        assert c.mget(keys) == keys
    assert c.closed and "closed" in repr(c)
    with pytest.raises(fabrickv.Error) as e:
        c.get(b"k")
    assert e.value.code == "UNAVAILABLE"


def test_the_cluster_example_runs(cluster_servers: list[Server]) -> None:
    example = ROOT / "python" / "examples" / "cluster_kv.py"
    r = subprocess.run([sys.executable, str(example), "--keys", "300",
                        *[s.native for s in cluster_servers]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("cluster servers=3 keys=300 per_server=")

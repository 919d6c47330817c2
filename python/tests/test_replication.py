"""A FabricKV cluster keeping two copies of each slot, from the clients
people run: three `fabrickv serve --replicas 2` processes (once per native
transport) and a `fabrickv cluster controller`. A primary killed with
SIGKILL loses no acknowledged write: redis-py's `RedisCluster`, the native
`fabrickv.Cluster` and a memcached client find every key at its new
primary, and an embedding table every row; the KV cache, kept as one copy,
follows the map too; the killed server, started again, is brought back in
sync.

Needs `make build` (the server), `make python` (the module) and etcd
(`make deps`)."""

import os
import signal
import subprocess
import time
import uuid
from typing import Callable, Iterator, cast

import pytest
from pymemcache.client.base import Client as MemcacheClient
from redis.cluster import RedisCluster

import numpy as np

from conftest import (BIN, PS_POOL_ARGS, TRANSPORTS, Etcd, Server, listen_addr, stop_all,
                      value_bytes)

# Generous deadlines: failover takes about half a second here, but the
# suite must pass on a machine whose cores are busy with something else.
SETTLE_S = 60.0

# A slot map as `cluster show` prints it: (primary, backups) per group.
Groups = list[tuple[int, list[int]]]


class ClusterServer(Server):
    """A server of a cluster registered in etcd, `name` the cluster's."""

    name: str


class Controller:
    """`fabrickv cluster controller` for one cluster, until `stop`."""

    def __init__(self, url: str, name: str) -> None:
        self.proc = subprocess.Popen(
            [str(BIN), "cluster", "controller", "--registry", url, "--cluster", name],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def slot_map(url: str, name: str) -> Groups:
    """The cluster's slot map as `fabrickv cluster show` prints it: one
    (primary, backups) per group."""
    out = subprocess.run([str(BIN), "cluster", "show", "--registry", url, "--cluster", name],
                         capture_output=True, text=True, timeout=30).stdout
    groups: Groups = []
    for line in out.splitlines():
        parts = line.split()
        if parts[:1] == ["slots"] and "primary" in parts:
            primary = int(parts[parts.index("primary") + 1])
            inside = line.split("backups [", 1)[1].split("]", 1)[0]
            groups.append((primary, [int(b) for b in inside.split(",") if b]))
    return groups


def wait_map(url: str, name: str, what: str,
             done: Callable[[Groups], bool]) -> Groups:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        groups = slot_map(url, name)
        if groups and done(groups):
            return groups
        time.sleep(0.05)
    pytest.fail(f"the slot map never showed {what}: {slot_map(url, name)}")


def start(etcd: Etcd, name: str, transport: str, i: int) -> ClusterServer:
    s = ClusterServer("--registry", etcd.url, "--cluster", name, "--id", str(i),
                      "--cluster-size", "3", "--replicas", "2", "--memcache", "127.0.0.1:0",
                      *PS_POOL_ARGS, listen=listen_addr(transport), workers=1)
    s.name, s.transport = name, transport
    return s


@pytest.fixture(params=TRANSPORTS)
def replicated(request: pytest.FixtureRequest,
               etcd: Etcd) -> Iterator[list[ClusterServer]]:
    """Three servers keeping two copies of each slot, and a controller."""
    name = f"rep-{uuid.uuid4().hex[:8]}"
    ctl = Controller(etcd.url, name)
    servers: list[ClusterServer] = []
    try:
        servers = [start(etcd, name, request.param, i) for i in range(3)]
        # Every server's run stamped and holding its roles.
        wait_map(etcd.url, name, "three groups of two", lambda g: len(g) == 3 and all(
            len(b) == 1 for _, b in g))
        yield servers
    finally:
        stop_all([s for s in servers if s.proc.poll() is None])
        ctl.stop()


def write_until_served(rc: RedisCluster, key: str, value: str) -> float:
    """Writes through redis-py until a server takes it; returns the time
    it took."""
    began = time.monotonic()
    while True:
        try:
            rc.set(key, value)
            return time.monotonic() - began
        except Exception:  # noqa: BLE001 - every error means "not yet"
            if time.monotonic() - began > SETTLE_S:
                raise
            time.sleep(0.005)


def test_a_killed_primary_loses_no_acknowledged_write(
        replicated: list[ClusterServer], etcd: Etcd) -> None:
    import fabrickv
    s0 = replicated[0]
    name = s0.name
    rc = RedisCluster(host=replicated[1].resp_host, port=replicated[1].resp_port,
                      socket_timeout=5)
    c = fabrickv.Cluster(registry=etcd.url, name=name, transport=s0.transport, timeout=10.0)
    try:
        tag = uuid.uuid4().hex[:8]
        native = [f"{tag}-n-{i}".encode() for i in range(150)]
        redis_keys = [f"{tag}-r-{i}" for i in range(150)]
        c.mput([(k, b"v1-" + k) for k in native])
        for k in redis_keys:
            assert rc.set(k, "v1-" + k)
        # A key of server 0's slots, to time the failover by.
        probe = next(k for k in redis_keys if c.server_of(k.encode()) == 0)

        os.kill(s0.proc.pid, signal.SIGKILL)
        s0.proc.wait()
        took = write_until_served(rc, probe, "after")
        assert took < SETTLE_S
        groups = wait_map(etcd.url, name, "server 0 failed over",
                          lambda g: g[0][0] == 1 and all(0 not in b for _, b in g))
        assert groups[0] == (1, [])

        # Every acknowledged write is there, through every client.
        assert c.mget(native) == [b"v1-" + k for k in native]
        for k in redis_keys:
            assert rc.get(k) == (b"after" if k == probe else ("v1-" + k).encode())
        assert replicated[2].memcache_port is not None
        mc = MemcacheClient((replicated[2].resp_host, replicated[2].memcache_port), timeout=10)
        try:
            assert mc.get(native[0].decode()) == b"v1-" + native[0]
        finally:
            mc.close()

        # Server 0 again, empty: streamed and back in both its groups.
        replicated[0] = start(etcd, name, s0.transport, 0)
        wait_map(etcd.url, name, "server 0 back in sync",
                 lambda g: 0 in g[0][1] and 0 in g[2][1])
        # Then the server that took over dies: group 0 fails over to 0.
        os.kill(replicated[1].proc.pid, signal.SIGKILL)
        replicated[1].proc.wait()
        wait_map(etcd.url, name, "server 1 failed over",
                 lambda g: g[0][0] == 0 and g[1][0] == 2)
        assert c.mget(native) == [b"v1-" + k for k in native]
        rc2 = RedisCluster(host=replicated[2].resp_host, port=replicated[2].resp_port,
                           socket_timeout=5)
        try:
            for k in redis_keys:
                assert rc2.get(k) == (b"after" if k == probe else ("v1-" + k).encode())
        finally:
            rc2.close()
    finally:
        c.close()
        rc.close()


def test_reads_that_accept_staleness_go_to_every_copy(
        replicated: list[ClusterServer], etcd: Etcd) -> None:
    import fabrickv
    s0 = replicated[0]
    writer = fabrickv.Cluster(registry=etcd.url, name=s0.name, transport=s0.transport,
                              timeout=10.0)
    reader = fabrickv.Cluster(registry=etcd.url, name=s0.name, transport=s0.transport,
                              timeout=10.0, read_from_replica=True)
    try:
        tag = uuid.uuid4().hex[:8]
        keys = [f"{tag}-{i}".encode() for i in range(300)]
        writer.mput([(k, b"v-" + k) for k in keys])
        # The keys of one group: its two copies may answer them, and no
        # other server holds them.
        primary, backups = slot_map(etcd.url, s0.name)[0]
        assert len(backups) == 1
        ours = [k for k in keys if writer.server_of(k) == primary]
        assert len(ours) > 50
        # Every server is up: none of their stats is None.
        before = [s["gets"] for s in cast(list[dict[str, int]], writer.stats())]
        # An acknowledged write is on every copy: any of them answers it.
        assert reader.mget(ours) == [b"v-" + k for k in ours]
        for k in ours[:60]:
            assert reader.get(k) == b"v-" + k
        after = [s["gets"] for s in cast(list[dict[str, int]], writer.stats())]
        served = [a - b for a, b in zip(after, before)]
        # Both copies served some of the reads (a reader of primaries only
        # would leave the backup none; each key picks a copy at random, so
        # all on one copy has odds of 2^-50 or less), the third server none.
        assert served[primary] > 0 and served[backups[0]] > 0, served
        assert served[primary] + served[backups[0]] == sum(served) == len(ours) + 60, served
        # Writes still go to the primaries; the reader sees its own.
        reader.put(keys[0], b"new")
        assert reader.get(keys[0]) == b"new"
    finally:
        writer.close()
        reader.close()


def test_embedding_rows_survive_a_killed_primary(
        replicated: list[ClusterServer], etcd: Etcd) -> None:
    import fabrickv
    s0 = replicated[0]
    c = fabrickv.Cluster(registry=etcd.url, name=s0.name, transport=s0.transport, timeout=10.0)
    try:
        t = c.create_table("emb", dim=4, optimizer="sgd", lr=0.5)
        keys = np.arange(300, dtype=np.uint64)
        rows = np.random.default_rng(3).standard_normal((len(keys), 4)).astype(np.float32)
        t.put(keys, rows)
        t.push(keys, np.ones((len(keys), 4), np.float32))
        np.testing.assert_allclose(t.pull(keys), rows - 0.5, rtol=1e-6)

        # Server 0 dies mid-training: the same calls go on, at the new
        # primaries, and no row or step is lost.
        os.kill(s0.proc.pid, signal.SIGKILL)
        s0.proc.wait()
        np.testing.assert_allclose(t.pull(keys), rows - 0.5, rtol=1e-6)
        t.push(keys, np.ones((len(keys), 4), np.float32))
        np.testing.assert_allclose(t.pull(keys), rows - 1.0, rtol=1e-6)
        wait_map(etcd.url, s0.name, "server 0 failed over",
                 lambda g: g[0][0] == 1 and all(0 not in b for _, b in g))
    finally:
        c.close()


def test_the_kv_cache_follows_the_slot_map(
        replicated: list[ClusterServer], etcd: Etcd) -> None:
    import fabrickv
    s0 = replicated[0]
    cc = fabrickv.ClusterCache(registry=etcd.url, name=s0.name, transport=s0.transport,
                               buffer_mb=4, timeout=10.0)
    try:
        keys = [f"blk-{i}".encode() for i in range(60)]
        for k in keys:
            cc.put(k, b"kv-" + k)
        assert [value_bytes(cc.get(k)) for k in keys] == [b"kv-" + k for k in keys]
        owners = {k: cc.server_of(k) for k in keys}
        assert set(owners.values()) == {0, 1, 2}

        # The cache keeps one copy: server 0's blocks die with it and read
        # as absent (to be recomputed), not as errors; the rest are there,
        # and the same client caches at the new primary.
        os.kill(s0.proc.pid, signal.SIGKILL)
        s0.proc.wait()
        assert [value_bytes(cc.get(k)) for k in keys] == [
            None if owners[k] == 0 else b"kv-" + k for k in keys]
        for k in keys:
            cc.put(k, b"kv2-" + k)
        assert [value_bytes(cc.get(k)) for k in keys] == [b"kv2-" + k for k in keys]
        assert all(cc.server_of(k) != 0 for k in keys)
    finally:
        cc.close()

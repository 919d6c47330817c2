"""A FabricKV cluster registered in etcd, from the clients people run:
three `fabrickv serve --registry etcd://...` processes (once per native
transport the servers listen on), found and followed by redis-py's
`RedisCluster` with no FabricKV code on the client side, by `fabrickv.Cluster`
routing by the same slot map, and by a memcached client talking to any one
server; `fabrickv cluster show` prints the map.

Needs `make build` (the server), `make python` (the module) and etcd
(`make deps`)."""

import subprocess
import time
import uuid
from typing import Iterator

import pytest
import redis
from pymemcache.client.base import Client as MemcacheClient
from redis.cluster import RedisCluster

from conftest import BIN, TRANSPORTS, Etcd, Server, start_slot_cluster, stop_all

# How long a dead server's registration may take to leave etcd (its lease
# is 5 s), with room for a loaded machine.
LEASE_GONE_S = 30.0


class ClusterServer(Server):
    """A server of a cluster registered in etcd, `name` the cluster's."""

    name: str


@pytest.fixture(scope="module", params=TRANSPORTS)
def slot_cluster(request: pytest.FixtureRequest,
                 etcd: Etcd) -> Iterator[list[ClusterServer]]:
    """Three servers of one etcd cluster, one copy of each slot."""
    name = f"rc-{uuid.uuid4().hex[:8]}"
    servers = start_slot_cluster(ClusterServer, etcd, name, request.param, 3, 3)
    for s in servers:
        s.name = name
        s.transport = request.param
    yield servers
    assert stop_all(servers) == [0, 0, 0], "the servers exit cleanly on SIGTERM"


def test_redis_cluster_routes_every_key_to_its_slots_server(
        slot_cluster: list[ClusterServer]) -> None:
    s0 = slot_cluster[0]
    rc = RedisCluster(host=s0.resp_host, port=s0.resp_port)
    try:
        assert len(rc.get_nodes()) == 3
        keys = [f"key-{i}-{uuid.uuid4().hex[:6]}" for i in range(300)]
        for i, k in enumerate(keys):
            assert rc.set(k, f"v{i}")
        assert [rc.get(k) for k in keys] == [f"v{i}".encode() for i in range(300)]
        # redis-py splits a multi-key call by slot.
        assert rc.mget_nonatomic(keys[:50]) == [f"v{i}".encode() for i in range(50)]
        assert rc.cluster_keyslot("foo") == 12182
        # Each key is stored on its slot's primary only: a plain client
        # gets the value there and a MOVED naming that server elsewhere.
        by_port = {s.resp_port: s for s in slot_cluster}
        for k in keys[:30]:
            owner = rc.get_node_from_key(k)
            for s in slot_cluster:
                plain = redis.Redis(host=s.resp_host, port=s.resp_port)
                try:
                    if s.resp_port == owner.port:
                        assert plain.get(k) is not None
                    else:
                        with pytest.raises(redis.exceptions.MovedError,
                                           match=f":{owner.port}$"):
                            plain.get(k)
                finally:
                    plain.close()
            assert owner.port in by_port
        # A pipeline is split by slot, too.
        pipe = rc.pipeline()
        for k in keys[:20]:
            pipe.incr(f"{{{k}}}.n")
        assert pipe.execute() == [1] * 20
    finally:
        rc.close()


def test_cluster_show_prints_the_slot_map(slot_cluster: list[ClusterServer], etcd: Etcd) -> None:
    out = subprocess.run([str(BIN), "cluster", "show", "--registry", etcd.url,
                          "--cluster", slot_cluster[0].name],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "slot map: epoch 1, 3 servers, 1 copy of each slot" in out.stdout
    for i, s in enumerate(slot_cluster):
        assert f"resp={s.resp_host}:{s.resp_port}" in out.stdout
    assert "slots 0-5460" in out.stdout


def test_a_stopped_server_leaves_the_map_reported_failing(etcd: Etcd) -> None:
    """A server that stops is out of etcd within its lease: CLUSTER INFO
    on the others reports its slots failing, and `cluster show` exits 1
    naming it."""
    name = f"rc-{uuid.uuid4().hex[:8]}"
    servers = [Server("--registry", etcd.url, "--cluster", name, "--id", str(i),
                      "--cluster-size", "2", workers=1) for i in range(2)]
    try:
        assert servers[1].stop() == 0
        plain = redis.Redis(host=servers[0].resp_host, port=servers[0].resp_port)
        deadline = time.monotonic() + LEASE_GONE_S
        while b"cluster_state:fail" not in plain.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline, "the stopped server never left the map"
            time.sleep(0.05)
        plain.close()
        out = subprocess.run([str(BIN), "cluster", "show", "--registry", etcd.url,
                              "--cluster", name], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1
        assert "1  down" in out.stdout and "not registered: [1]" in out.stderr
    finally:
        stop_all(servers)


def test_every_face_shares_the_one_keyspace(slot_cluster: list[ClusterServer], etcd: Etcd) -> None:
    """What redis-py writes, the native cluster client reads, and the
    other way round; a memcached client reaches every key from any one
    server (the servers forward a key of another's slots to it)."""
    try:
        import fabrickv
    except ImportError as e:  # a missing build fails the run, never skips it
        pytest.fail(f"the fabrickv module is not installed ({e}): run `make python`")
    s0 = slot_cluster[0]
    rc = RedisCluster(host=s0.resp_host, port=s0.resp_port)
    c = fabrickv.Cluster(registry=etcd.url, name=s0.name, transport=s0.transport, timeout=10.0)
    try:
        tag = uuid.uuid4().hex[:8]
        keys = [f"{tag}-{i}".encode() for i in range(120)]
        c.mput([(k, b"native-" + k) for k in keys])
        assert [rc.get(k) for k in keys] == [b"native-" + k for k in keys]
        for k in keys[:40]:
            rc.set(k, b"redis-" + k)
        assert c.mget(keys[:40]) == [b"redis-" + k for k in keys[:40]]
        # The native client's owner of a key is the Redis client's.
        by_port = {s.resp_port: i for i, s in enumerate(slot_cluster)}
        for k in keys[:20]:
            assert c.server_of(k) == by_port[rc.get_node_from_key(k).port]
        for s in slot_cluster:
            assert s.memcache_port is not None
            mc = MemcacheClient((s.resp_host, s.memcache_port), timeout=10)
            try:
                assert mc.get_many([k.decode() for k in keys[40:60]]) == {
                    k.decode(): b"native-" + k for k in keys[40:60]}
                # Acknowledged (pymemcache sends noreply unless told not
                # to): a write nobody waited for may land after a read.
                assert mc.set(f"{tag}-mc-{s.memcache_port}", b"m", noreply=False) is True
            finally:
                mc.close()
        assert c.get(f"{tag}-mc-{slot_cluster[1].memcache_port}".encode()) == b"m"
    finally:
        c.close()
        rc.close()

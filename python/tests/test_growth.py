"""Growing, evening out and shrinking a cluster in etcd with the CLI
(`fabrickv cluster add`, `rebalance`, `remove`) while the clients people
run write through it: a memcached client talking to one server (which
forwards a key of another server's slots to it, and holds a command whose
slot is being handed over until the new owner has it) and redis-py's
`RedisCluster` (which retries `-TRYAGAIN` and follows `-MOVED`). A
memcache connection opened before its server took a slot over is closed
at its first write of that slot, unrun (it may be a write the client gave
up on, delivered late): the memcached client reconnects and sends it
again, as pymemcache's `RetryingClient` and libmemcached do. Every
write a client was told is stored is read back after, through both
clients; the new server leads a quarter of the slots after `add` and none
after `remove`. Once per native transport the servers listen on.

Needs `make build` (the server), `make python` and etcd (`make deps`)."""

import re
import subprocess
import threading
import time
import uuid
from typing import Callable, Iterator

import pytest
import redis
from pymemcache.client.base import Client as MemcacheClient
from pymemcache.client.retrying import RetryingClient
from pymemcache.exceptions import MemcacheUnexpectedCloseError
from redis.cluster import RedisCluster

from conftest import BIN, TRANSPORTS, Etcd, Server, start_slot_cluster, stop_all

# How long a move may take on a loaded machine (one takes well under a
# second here).
MOVE_WAIT_S = 120

# Keys each writer cycles over.
KEYS = 300

# Redis Cluster's slot count.
SLOTS = 16384


@pytest.fixture(params=TRANSPORTS)
def four_servers(request: pytest.FixtureRequest, etcd: Etcd) -> Iterator[tuple[str, list[Server]]]:
    """A cluster of three servers (one copy of each slot) and a fourth
    registered beside it, holding nothing until it is added."""
    name = f"grow-{uuid.uuid4().hex[:8]}"
    servers = start_slot_cluster(Server, etcd, name, request.param, 4, 3)
    yield name, servers
    assert stop_all(servers) == [0, 0, 0, 0], "the servers exit cleanly on SIGTERM"


def cluster_cli(etcd: Etcd, name: str, *argv: str) -> str:
    """Runs `fabrickv cluster ARGV` against the cluster; its output, after
    checking it succeeded."""
    out = subprocess.run(
        [str(BIN), "cluster", *argv, "--registry", etcd.url, "--cluster", name,
         "--wait", str(MOVE_WAIT_S)],
        capture_output=True, text=True, timeout=MOVE_WAIT_S + 30)
    assert out.returncode == 0, f"cluster {' '.join(argv)} failed:\n{out.stdout}{out.stderr}"
    return out.stdout


def slots_led(server: Server) -> dict[int, int]:
    """How many slots each RESP port leads, as `CLUSTER SLOTS` says."""
    r = redis.Redis(host=server.resp_host, port=server.resp_port)
    try:
        led: dict[int, int] = {}
        for entry in r.execute_command("CLUSTER", "SLOTS"):
            first, last, primary = entry[0], entry[1], entry[2]
            port = int(primary[1])
            led[port] = led.get(port, 0) + last - first + 1
        return led
    finally:
        r.close()


class Writer(threading.Thread):
    """Overwrites keys `PREFIX-i` through one client until stopped,
    remembering the last value it was told is stored for each, and every
    error it met."""

    def __init__(self, prefix: str, put: Callable[[str, str], bool]) -> None:
        super().__init__(daemon=True)
        self.prefix = prefix
        self.put = put
        self.stop_now = threading.Event()
        self.last: dict[str, str] = {}
        self.errors: list[str] = []
        self.writes = 0

    def run(self) -> None:
        n = 0
        while not self.stop_now.is_set():
            key = f"{self.prefix}-{(n * 7919) % KEYS}"
            value = f"v{n}"
            try:
                if self.put(key, value):
                    self.last[key] = value
                    self.writes += 1
                else:
                    self.errors.append(f"{key}: not stored")
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                self.errors.append(f"{key}: {e!r}")
            n += 1


def test_a_cluster_grows_evens_out_and_shrinks_while_clients_write(
        four_servers: tuple[str, list[Server]], etcd: Etcd) -> None:
    name, servers = four_servers
    s0, new = servers[0], servers[3]
    assert s0.memcache_port is not None
    mc = RetryingClient(MemcacheClient((s0.resp_host, s0.memcache_port), timeout=30),
                        attempts=3, retry_for=[MemcacheUnexpectedCloseError])
    rc = RedisCluster(host=s0.resp_host, port=s0.resp_port, socket_timeout=30)
    tag = uuid.uuid4().hex[:6]
    writers = [
        Writer(f"{tag}-mc", lambda k, v: bool(mc.set(k, v.encode(), noreply=False))),
        Writer(f"{tag}-rc", lambda k, v: bool(rc.set(k, v))),
    ]
    try:
        for w in writers:
            w.start()

        def wait_for_writes(n: int) -> None:
            # Each writer makes progress between the changes.
            base = [w.writes for w in writers]
            deadline = time.monotonic() + MOVE_WAIT_S
            for w, b in zip(writers, base):
                while w.writes < b + n and time.monotonic() < deadline and w.is_alive():
                    w.stop_now.wait(0.05)
                assert w.writes >= b + n, f"{w.prefix}: no writes go through ({w.errors[-3:]})"

        wait_for_writes(200)
        out = cluster_cli(etcd, name, "add", "--id", "3")
        moved = re.search(r"slots to move \(([\d.]+)% of all\)", out)
        assert moved and abs(float(moved.group(1)) - 25.0) < 5.0, out
        led = slots_led(s0)
        assert abs(led.get(new.resp_port, 0) - SLOTS // 4) <= SLOTS // 20, led

        wait_for_writes(200)
        cluster_cli(etcd, name, "rebalance")
        wait_for_writes(200)
        out = cluster_cli(etcd, name, "remove", "--id", "3")
        assert "server 3 holds no slots now" in out, out
        led = slots_led(s0)
        assert new.resp_port not in led and sum(led.values()) == SLOTS, led
        wait_for_writes(200)
    finally:
        for w in writers:
            w.stop_now.set()
        for w in writers:
            w.join(timeout=60)

    for w in writers:
        assert not w.errors, f"{w.prefix}: {len(w.errors)} writes failed, first: {w.errors[:3]}"
        assert w.last, f"{w.prefix}: nothing was written"
    # Every acknowledged write is there, through either client.
    for w in writers:
        for key, value in w.last.items():
            assert rc.get(key) == value.encode(), f"{key} through RedisCluster"
            assert mc.get(key) == value.encode(), f"{key} through memcache"
    mc.close()
    rc.close()

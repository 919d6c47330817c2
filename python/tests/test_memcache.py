"""The memcache front end (`fabrickv serve --memcache ADDR`) through
pymemcache, a memcached client in common use: the text commands, client
flags and CAS, and one keyspace with RESP's database 0."""

import re
import socket
import time
from typing import Iterator

import pytest
import redis

from conftest import START_TIMEOUT_S, Server

pymemcache = pytest.importorskip("pymemcache")
from pymemcache.client.base import Client  # noqa: E402


class McServer(Server):
    """A server with the memcache front end on a port the kernel picks;
    its banner line gives the address before the main banner."""

    mc_host: str
    mc_port: int

    def __init__(self) -> None:
        super().__init__("--memcache", "127.0.0.1:0")

    def _addresses(self) -> tuple[str, str, int]:
        deadline = time.monotonic() + START_TIMEOUT_S
        serving = re.compile(r"serving on (\S+), RESP on (\S+):(\d+)")
        memcache = re.compile(r"memcache on (\S+):(\d+)")
        while time.monotonic() < deadline:
            assert self.proc.stderr is not None
            line = self.proc.stderr.readline()
            if not line:
                break
            m = memcache.search(line)
            if m:
                self.mc_host, self.mc_port = m.group(1), int(m.group(2))
            m = serving.search(line)
            if m:
                return m.group(1), m.group(2), int(m.group(3))
        self.stop()
        pytest.fail("fabrickv serve did not print its addresses")


@pytest.fixture(scope="module")
def mc_server() -> Iterator[McServer]:
    s = McServer()
    yield s
    assert s.stop() == 0, "the server exits cleanly on SIGTERM"


@pytest.fixture
def mc(mc_server: McServer) -> Iterator[Client]:
    c = Client((mc_server.mc_host, mc_server.mc_port), connect_timeout=5, timeout=5)
    yield c
    c.close()


def test_set_get_delete_and_flags(mc: Client) -> None:
    assert mc.set("py:a", b"hello", noreply=False)
    assert mc.get("py:a") == b"hello"
    assert mc.get_many(["py:a", "py:missing"]) == {"py:a": b"hello"}
    assert mc.delete("py:a", noreply=False)
    assert mc.get("py:a") is None
    # Client flags are stored per item: pymemcache keeps its serializer's
    # type tag in them, so an int comes back as an int.
    mc.set("py:int", 12345, noreply=False)
    assert mc.get("py:int") == b"12345" or mc.get("py:int") == 12345
    raw = socket.create_connection((mc.server[0], mc.server[1]), timeout=5)
    raw.sendall(b"set py:f 3735928559 0 1\r\nx\r\nget py:f\r\n")
    reply = b""
    while not reply.endswith(b"END\r\n"):
        reply += raw.recv(4096)
    assert reply == b"STORED\r\nVALUE py:f 3735928559 1\r\nx\r\nEND\r\n"
    raw.close()


def test_add_replace_append_prepend(mc: Client) -> None:
    mc.delete("py:s", noreply=False)
    assert not mc.replace("py:s", b"x", noreply=False)
    assert mc.add("py:s", b"mid", noreply=False)
    assert not mc.add("py:s", b"again", noreply=False)
    assert mc.append("py:s", b"-end", noreply=False)
    assert mc.prepend("py:s", b"start-", noreply=False)
    assert mc.get("py:s") == b"start-mid-end"
    assert mc.replace("py:s", b"new", noreply=False)
    assert mc.get("py:s") == b"new"


def test_cas(mc: Client) -> None:
    mc.set("py:c", b"one", noreply=False)
    value, token = mc.gets("py:c")
    assert value == b"one"
    assert mc.cas("py:c", b"two", token, noreply=False) is True
    assert mc.cas("py:c", b"three", token, noreply=False) is False
    assert mc.get("py:c") == b"two"
    assert mc.cas("py:nothere", b"x", b"1", noreply=False) is None


def test_incr_decr(mc: Client) -> None:
    mc.set("py:n", b"10", noreply=False)
    assert mc.incr("py:n", 5) == 15
    assert mc.decr("py:n", 100) == 0
    assert mc.incr("py:none", 1) is None
    mc.set("py:n", b"18446744073709551615", noreply=False)
    assert mc.incr("py:n", 2) == 1
    mc.set("py:t", b"text", noreply=False)
    with pytest.raises(pymemcache.exceptions.MemcacheClientError):
        mc.incr("py:t", 1)


def test_expiry_touch_and_flush(mc: Client) -> None:
    mc.set("py:e", b"v", expire=1, noreply=False)
    assert mc.get("py:e") == b"v"
    assert mc.touch("py:e", 100, noreply=False)
    time.sleep(1.2)
    assert mc.get("py:e") == b"v", "touched to 100 s"
    mc.set("py:gone", b"v", expire=-1, noreply=False)
    assert mc.get("py:gone") is None
    assert mc.flush_all(noreply=False)
    assert mc.get("py:e") is None


def test_stats_and_version(mc: Client) -> None:
    stats = mc.stats()
    for name in (b"pid", b"uptime", b"curr_connections", b"cmd_get", b"get_hits",
                 b"curr_items", b"limit_maxbytes", b"threads"):
        assert name in stats, name
    assert mc.version()


def test_one_keyspace_with_resp(mc: Client, mc_server: McServer) -> None:
    r = redis.Redis(host=mc_server.resp_host, port=mc_server.resp_port)
    mc.set("py:shared", b"from-memcache", noreply=False)
    assert r.get("py:shared") == b"from-memcache"
    r.set("py:from-resp", b"hi")
    assert mc.get("py:from-resp") == b"hi"


def test_meta_get_and_set(mc_server: McServer) -> None:
    s = socket.create_connection((mc_server.mc_host, mc_server.mc_port), timeout=5)
    s.sendall(b"ms py:m 2 F7 T60\r\nhi\r\nmg py:m v f k\r\nmg py:none v q\r\nmn\r\n")
    reply = b""
    while not reply.endswith(b"MN\r\n"):
        reply += s.recv(4096)
    assert reply == b"HD\r\nVA 2 f7 kpy:m\r\nhi\r\nMN\r\n"
    s.close()

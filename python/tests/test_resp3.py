"""The RESP front end through today's clients with their defaults: redis-py
(RESP3 by default from redis-py 8, RESP2 before it) with the protocol it
picks and with `protocol=2`, with and without a password (HELLO ... AUTH),
and redis-cli in both protocols."""

import shutil
import socket
import subprocess
import time
from typing import Any, Iterator

import pytest
import redis

from conftest import Server, one_try

# None: the client's own default (3 on redis-py 8, 2 on redis-py 5).
PROTOCOLS = (None, 2)


def connect(server: Server, protocol: int | None, **kw: Any) -> redis.Redis:
    if protocol is not None:
        kw["protocol"] = protocol
    return redis.Redis(host=server.resp_host, port=server.resp_port, **kw)


@pytest.fixture(params=PROTOCOLS, ids=("default", "resp2"))
def r(server: Server, request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    c = connect(server, request.param)
    yield c
    c.close()


def test_ordinary_calls(r: redis.Redis) -> None:
    # The server is shared by the module's tests: start from no keys.
    r.delete("p3:a", "p3:b", "p3:c", "p3:n", "p3:nx")
    assert r.ping() is True
    assert r.set("p3:a", "1") is True
    assert r.get("p3:a") == b"1"
    assert r.get("p3:absent") is None
    assert r.mset({"p3:b": "2", "p3:c": "3"}) is True
    assert r.mget("p3:a", "p3:b", "p3:absent") == [b"1", b"2", None]
    assert r.incr("p3:n") == 1
    assert r.incrby("p3:n", 5) == 6
    assert r.set("p3:nx", "x", nx=True) is True
    assert r.set("p3:nx", "y", nx=True) is None
    assert r.expire("p3:a", 100) is True
    assert 99 <= r.ttl("p3:a") <= 100
    assert r.pttl("p3:absent") == -2
    assert r.persist("p3:a") is True
    assert r.exists("p3:a", "p3:b", "p3:absent") == 2
    assert r.delete("p3:a", "p3:absent") == 1
    assert r.strlen("p3:b") == 1
    assert r.echo("hi") == b"hi"
    assert r.dbsize() >= 2
    p = r.pipeline(transaction=False)
    for i in range(100):
        p.set(f"p3:pipe:{i}", i)
        p.get(f"p3:pipe:{i}")
    out = p.execute()
    assert out[1::2] == [str(i).encode() for i in range(100)]


def test_server_commands(r: redis.Redis) -> None:
    info = r.info()
    assert info["redis_version"]
    assert info["role"] == "master"
    assert info["connected_clients"] >= 1
    assert "used_cpu_user" in r.info("cpu")
    assert "db0" in r.info("keyspace")
    r.get("p3:x")
    stats = r.info("commandstats")
    assert stats["cmdstat_get"]["calls"] >= 1
    assert r.config_get("appendonly") == {"appendonly": "no"}
    assert "maxmemory" in r.config_get("max*")
    assert r.config_set("timeout", 0) is True
    with pytest.raises(redis.ResponseError, match="Unsupported CONFIG parameter"):
        r.config_set("no-such-setting", 1)
    with pytest.raises(redis.ResponseError, match="immutable"):
        r.config_set("maxclients", 5)
    assert r.config_resetstat() is True
    assert r.command_count() > 20
    commands = r.command()
    assert commands["get"]["arity"] == 2
    assert r.command_getkeys("MSET", "a", "1", "b", "2") in (["a", "b"], [b"a", b"b"])


def test_client_commands(r: redis.Redis) -> None:
    assert r.client_getname() is None
    assert r.client_setname("py-client") is True
    assert r.client_getname() in ("py-client", b"py-client")
    me = r.client_id()
    assert me > 0
    clients = r.client_list()
    mine = [c for c in clients if int(c["id"]) == me]
    assert len(mine) == 1
    assert mine[0]["name"] == "py-client"
    # redis-py names itself with CLIENT SETINFO on connect.
    assert mine[0]["lib-name"].startswith("redis-py")
    assert mine[0]["lib-ver"]
    assert int(r.client_info()["id"]) == me
    with pytest.raises(redis.ResponseError, match="cannot contain spaces"):
        r.client_setname("has space")
    assert r.client_no_evict("on") in (True, b"OK", "OK")


def test_client_kill_closes_the_connection_at_once(server: Server, r: redis.Redis) -> None:
    s = socket.create_connection((server.resp_host, server.resp_port), timeout=5)
    s.sendall(b"CLIENT ID\r\n")
    reply = s.recv(64)
    victim = int(reply[1:].split(b"\r\n")[0])
    # redis-py 8.1 types `_id` as str; it sends any encodable value, and an
    # int is what CLIENT ID replies.
    assert r.client_kill_filter(_id=victim) == 1  # type: ignore[arg-type]
    start = time.monotonic()
    assert s.recv(64) == b"", "the killed connection is closed"
    assert time.monotonic() - start < 2
    s.close()


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=("default", "resp2"))
def test_password_via_hello_or_auth(auth_server: Server, protocol: int | None) -> None:
    ok = connect(auth_server, protocol, password="s3cret pass")
    assert ok.set("p3:auth", "v") and ok.get("p3:auth") == b"v"
    assert ok.get("p3:nothing") is None
    ok.close()
    with pytest.raises(redis.AuthenticationError):
        connect(auth_server, protocol, password="wrong", retry=one_try()).ping()
    with pytest.raises(redis.AuthenticationError):
        connect(auth_server, protocol, retry=one_try()).get("p3:auth")


def test_unauthenticated_big_header_is_refused_at_once(auth_server: Server) -> None:
    s = socket.create_connection((auth_server.resp_host, auth_server.resp_port), timeout=5)
    s.sendall(b"*100\r\n")
    reply = s.recv(256)
    assert reply == b"-ERR Protocol error: unauthenticated multibulk length\r\n"
    assert s.recv(64) == b""
    s.close()


def cli(server: Server, *args: str) -> str:
    path = shutil.which("redis-cli")
    if path is None:
        pytest.fail("redis-cli is missing: run `make deps`")
    return subprocess.run(
        [path, "-h", server.resp_host, "-p", str(server.resp_port), *args],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout


@pytest.mark.parametrize("flags", [(), ("-3",)], ids=("resp2", "resp3"))
def test_redis_cli(server: Server, flags: tuple[str, ...]) -> None:
    assert cli(server, *flags, "PING").strip() == "PONG"
    assert cli(server, *flags, "SET", "p3:cli", "v").strip() == "OK"
    assert cli(server, *flags, "GET", "p3:cli").strip() == "v"
    assert cli(server, *flags, "GET", "p3:cli-absent").strip() == ""
    assert "appendonly" in cli(server, *flags, "CONFIG", "GET", "appendonly")
    assert "redis_version" in cli(server, *flags, "INFO", "server")
    assert "id=" in cli(server, *flags, "CLIENT", "LIST")
    assert "readonly" in cli(server, *flags, "COMMAND", "INFO", "get")


def test_lcs_idx_is_a_map_in_resp3(server: Server) -> None:
    """Regression: LCS ... IDX replied with an array under RESP3, where
    Redis replies with a map."""
    c = connect(server, 3)
    c.set("lcs:1", "ohmytext")
    c.set("lcs:2", "mynewtext")
    raw = c.execute_command("LCS", "lcs:1", "lcs:2", "IDX", "MINMATCHLEN", "4",
                            "WITHMATCHLEN")
    assert isinstance(raw, dict), raw
    assert raw[b"len"] == 6
    assert raw[b"matches"] == [[[4, 7], [5, 8], 4]]
    c.close()

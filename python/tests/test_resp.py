"""The Redis-compatible front-end, driven by unmodified Redis clients:
redis-py, redis-cli and redis-benchmark."""

import shutil
import subprocess
import time
from typing import Iterator

import pytest
import redis

from conftest import Server, one_try


@pytest.fixture
def r(server: Server) -> Iterator[redis.Redis]:
    c = redis.Redis(host=server.resp_host, port=server.resp_port)
    yield c
    c.close()


def test_strings_round_trip(r: redis.Redis) -> None:
    assert r.ping() is True
    assert r.set("greeting", "hello") is True
    assert r.get("greeting") == b"hello"
    assert r.get("absent") is None
    value = bytes(range(256)) * 4 + b"\r\n\x00"
    assert r.set(b"bin\x00key", value)
    assert r.get(b"bin\x00key") == value
    big = b"v" * (1 << 20)
    assert r.set("big", big)
    assert r.get("big") == big
    assert r.strlen("big") == 1 << 20


def test_set_options(r: redis.Redis) -> None:
    r.delete("opt")
    assert r.set("opt", "a", xx=True) is None
    assert r.set("opt", "a", nx=True) is True
    assert r.set("opt", "b", nx=True) is None
    assert r.get("opt") == b"a"
    assert r.set("opt", "c", xx=True, ex=100) is True
    assert 99 <= r.ttl("opt") <= 100
    assert r.set("opt", "d", px=2500) is True
    assert 2000 < r.pttl("opt") <= 2500
    assert r.set("opt", "e", keepttl=True) is True
    assert r.ttl("opt") > 0
    assert r.set("opt", "f", get=True) == b"e"
    assert r.ttl("opt") == -1


def test_multi_key_commands(r: redis.Redis) -> None:
    pairs = {f"mk:{i}": f"value {i}".encode() for i in range(100)}
    assert r.mset(pairs) is True
    keys = list(pairs) + ["mk:absent"]
    assert r.mget(keys) == list(pairs.values()) + [None]
    assert r.exists("mk:1", "mk:2", "mk:absent") == 2
    assert r.delete("mk:1", "mk:2", "mk:absent") == 2
    assert r.exists("mk:1") == 0


def test_expiry_is_active(r: redis.Redis) -> None:
    """A key past its TTL disappears without being read (the sweep)."""
    before = r.dbsize()
    r.set("short", "x", px=50)
    r.expire("short", 1)  # re-arm with EXPIRE to cover it too
    assert r.ttl("short") == 1
    r.pexpire("short", 50)
    deadline = time.monotonic() + 10
    while r.dbsize() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.dbsize() == before, "expired key reclaimed without access"
    assert r.get("short") is None
    assert r.ttl("short") == -2


def test_incr(r: redis.Redis) -> None:
    r.delete("counter")
    assert r.incr("counter") == 1
    assert r.incrby("counter", 10) == 11
    assert r.decr("counter") == 10
    assert r.decrby("counter", 20) == -10
    r.set("text", "abc")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        r.incr("text")
    r.set("max", str(2**63 - 1))
    with pytest.raises(redis.ResponseError, match="overflow"):
        r.incr("max")


def test_errors(r: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match="unknown command 'NOSUCH'"):
        r.execute_command("NOSUCH", "a")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'get'"):
        r.execute_command("GET")
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command("SET", "k", "v", "EX")
    with pytest.raises(redis.ResponseError, match="at most 250 bytes"):
        r.set("k" * 251, "v")
    # The connection is still usable after errors.
    assert r.ping()


def test_pipelining(r: redis.Redis) -> None:
    p = r.pipeline(transaction=False)
    for i in range(2000):
        p.set(f"p:{i}", i)
    for i in range(2000):
        p.get(f"p:{i}")
    out = p.execute()
    assert out[:2000] == [True] * 2000
    assert out[2000:] == [str(i).encode() for i in range(2000)]


def test_info_and_config(r: redis.Redis) -> None:
    info = r.info()
    assert "redis_version" in info
    assert info["connected_clients"] >= 1
    assert "db0" in r.info("keyspace")
    assert r.config_get("save") == {"save": ""}
    assert r.config_get("appendonly") == {"appendonly": "no"}


def test_auth(auth_server: Server) -> None:
    c = redis.Redis(host=auth_server.resp_host, port=auth_server.resp_port,
                    retry=one_try())
    with pytest.raises(redis.AuthenticationError):
        c.get("k")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host=auth_server.resp_host, port=auth_server.resp_port,
                    password="wrong", retry=one_try()).ping()
    ok = redis.Redis(host=auth_server.resp_host, port=auth_server.resp_port,
                     password="s3cret pass")
    assert ok.set("k", "v") and ok.get("k") == b"v"
    ok2 = redis.Redis(host=auth_server.resp_host, port=auth_server.resp_port,
                      username="default", password="s3cret pass")
    assert ok2.get("k") == b"v"


def redis_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: run `make deps`")
    return path


def cli(server: Server, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [redis_tool("redis-cli"), "-h", server.resp_host, "-p", str(server.resp_port), *args],
        input=stdin, capture_output=True, text=True, timeout=30, check=True,
    ).stdout


def test_redis_cli(server: Server) -> None:
    assert cli(server, "PING").strip() == "PONG"
    assert cli(server, "SET", "cli key", "cli value").strip() == "OK"
    assert cli(server, "GET", "cli key").strip() == "cli value"
    assert cli(server, "--raw", "INCR", "cli:n").strip() == "1"
    assert "unknown command" in cli(server, "FOO")
    # Commands on stdin, one per line, as scripts feed redis-cli.
    out = cli(server, stdin="SET a 1\nGET a\nDEL a\nEXISTS a\n")
    assert out.split() == ["OK", "1", "1", "0"]


def test_redis_benchmark_runs_unchanged(server: Server, r: redis.Redis) -> None:
    out = subprocess.run(
        [redis_tool("redis-benchmark"), "-h", server.resp_host, "-p", str(server.resp_port),
         "-t", "ping,set,get,incr,mset", "-n", "2000", "-r", "1000", "-P", "16",
         "-c", "8", "--csv"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    rows = {line.split(",")[0].strip('"'): line for line in out.splitlines()[1:] if line}
    for test in ["PING_INLINE", "PING_MBULK", "SET", "GET", "INCR", "MSET (10 keys)"]:
        assert test in rows, f"{test} missing from {out}"
        assert float(rows[test].split(",")[1].strip('"')) > 0
    # The SETs it made are there: keys key:000000000NNN with 3-byte values.
    assert r.get("key:__rand_int__") is None
    values = [r.get(f"key:{i:012d}") for i in range(1000)]
    assert sum(v is not None and len(v) == 3 for v in values) > 500


def test_commands_of_many_arguments(r: redis.Redis) -> None:
    """Regression: more than 2,049 arguments dropped the connection; Redis
    takes MSET of 10,001 pairs and MGET/DEL of 100,000 keys."""
    pairs = {f"many:{i}": f"v{i}".encode() for i in range(10_001)}
    assert r.mset(pairs) is True
    keys = [f"many:{i}" for i in range(100_000)]
    got = r.mget(keys)
    assert len(got) == 100_000
    assert got[:10_001] == list(pairs.values())
    assert got[10_001:] == [None] * (100_000 - 10_001)
    assert r.delete(*keys) == 10_001
    assert r.exists("many:0", "many:10000") == 0
    assert r.ping() is True


def test_time(r: redis.Redis) -> None:
    """Regression: TIME was missing; clients read the server's clock with it
    before EXPIREAT and SET PXAT."""
    before = time.time()
    secs, micros = r.time()
    assert 0 <= micros < 1_000_000
    assert before - 5 <= secs + micros / 1e6 <= time.time() + 5
    # redis-py 8 leaves COMMAND INFO to execute_command.
    info = r.execute_command("COMMAND", "INFO", "time")["time"]
    assert info["arity"] == 1
    assert info["flags"] == ["loading", "stale", "fast"]
    assert info["acl_categories"] == ["@fast"]


def test_absolute_expiry_round_trips_exactly(r: redis.Redis) -> None:
    """Regression: PEXPIRETIME came back 1 ms early in 6-20% of tries after
    SET PXAT or PEXPIREAT sent alone (each command its own round trip)."""
    base = time.time_ns() // 1_000_000 + 3_600_000
    for i in range(300):
        t = base + 7 * i
        assert r.set("abs", "v", pxat=t) is True
        assert r.pexpiretime("abs") == t
        assert r.pexpireat("abs", t + 3) is True
        assert r.pexpiretime("abs") == t + 3
    r.delete("abs")


def test_far_future_expiry(r: redis.Redis) -> None:
    """Regression: an expiry more than 10 years ahead was refused; Redis
    keeps any time whose milliseconds fit a signed 64-bit integer."""
    top = 2**63 - 1
    r.set("far", "v")
    assert r.pexpireat("far", top) is True
    assert r.pexpiretime("far") == top
    assert r.expireat("far", 9223372036854775) is True
    assert r.expiretime("far") == 9223372036854775
    with pytest.raises(redis.ResponseError, match="invalid expire time in 'expireat'"):
        r.expireat("far", 9223372036854776)
    assert r.set("far", "v", exat=9223372036854775) is True
    assert r.pexpiretime("far") == 9223372036854775000
    with pytest.raises(redis.ResponseError, match="invalid expire time in 'set'"):
        r.set("far", "v", px=top)
    century = 100 * 365 * 24 * 3600
    assert r.set("far", "v", ex=century) is True
    assert century - 2 <= r.ttl("far") <= century
    r.delete("far")


def test_auth_without_a_password_as_redis_7(r: redis.Redis) -> None:
    """Regression: with no password set, AUTH with three arguments is a
    syntax error; one argument keeps the "without any password" error."""
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command("AUTH", "a", "b", "c")
    # redis-py raises this one as an AuthenticationError, as with Redis.
    with pytest.raises(redis.AuthenticationError, match="without any password"):
        r.execute_command("AUTH", "a")
    assert r.ping() is True


def test_config_get_what_clients_read(server: Server, r: redis.Redis) -> None:
    """Regression: CONFIG GET * listed 8 parameters; it lists every one
    clients read at start that FabricKV can answer truthfully."""
    conf = r.config_get("*")
    for name in ("maxmemory", "maxmemory-policy", "databases", "save",
                 "appendonly", "port", "bind", "timeout", "maxclients"):
        assert name in conf, name
    assert conf["port"] == str(server.resp_port)
    assert conf["bind"] == server.resp_host
    assert conf["maxmemory"] == str(64 << 20)
    assert conf["save"] == "" and conf["appendonly"] == "no"
    assert "requirepass" not in conf
    assert r.config_get("maxmemory*") == {
        "maxmemory": conf["maxmemory"],
        "maxmemory-policy": conf["maxmemory-policy"],
        "maxmemory-clients": conf["maxmemory-clients"],
    }
    both = r.config_get("port", "p*", "b?nd")
    assert both == {"port": conf["port"], "proto-max-bulk-len": "536870912",
                    "bind": conf["bind"]}

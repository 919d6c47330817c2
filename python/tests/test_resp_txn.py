"""Transactions and the string and keyspace commands through redis-py:
pipeline() (MULTI/EXEC), WATCH against a conflicting writer, SCAN, KEYS,
RENAME, COPY and friends. Written for redis-py 5 and later."""

import threading
import time
from typing import Iterator, cast

import pytest
import redis

from conftest import Server


@pytest.fixture
def r(server: Server) -> Iterator[redis.Redis]:
    c = redis.Redis(host=server.resp_host, port=server.resp_port)
    yield c
    c.close()


@pytest.fixture
def r2(server: Server) -> Iterator[redis.Redis]:
    c = redis.Redis(host=server.resp_host, port=server.resp_port)
    yield c
    c.close()


def test_pipeline_is_a_transaction(r: redis.Redis) -> None:
    r.delete("tx:a", "tx:b")
    with r.pipeline() as p:
        # A pipeline's commands return the pipeline; redis-py 8.1 types them
        # as the plain client's replies (its overloads match a Pipeline as a
        # synchronous client), so chaining them is refused.
        p.set("tx:a", 1).incrby(  # type: ignore[union-attr]
            "tx:a", 41).mget("tx:a", "tx:b").get("tx:a")
        assert p.execute() == [True, 42, [b"42", None], b"42"]
    # A command that fails at run time fails alone.
    with r.pipeline() as p:
        p.set("tx:b", "text").incr("tx:b").set("tx:a", "after")  # type: ignore[union-attr]
        res = p.execute(raise_on_error=False)
    assert res[0] is True and res[2] is True
    assert isinstance(res[1], redis.ResponseError)
    assert r.get("tx:a") == b"after"


def test_watch_aborts_on_a_conflicting_writer(r: redis.Redis, r2: redis.Redis) -> None:
    r.set("tx:w", 1)
    with r.pipeline() as p:
        p.watch("tx:w")
        current = int(cast(bytes, p.get("tx:w")))
        r2.set("tx:w", 100)
        p.multi()
        p.set("tx:w", current + 1)
        with pytest.raises(redis.WatchError):
            p.execute()
    assert r.get("tx:w") == b"100"
    # Untouched, the same transaction goes through.
    with r.pipeline() as p:
        p.watch("tx:w")
        current = int(cast(bytes, p.get("tx:w")))
        p.multi()
        p.set("tx:w", current + 1)
        assert p.execute() == [True]
    assert r.get("tx:w") == b"101"


def test_transaction_helper_retries_until_it_wins(r: redis.Redis, r2: redis.Redis) -> None:
    r.set("tx:counter", 0)
    stop = threading.Event()

    def meddle() -> None:
        while not stop.is_set():
            r2.incr("tx:noise")
            time.sleep(0.001)

    t = threading.Thread(target=meddle)
    t.start()
    try:
        for _ in range(50):
            def bump(pipe: redis.client.Pipeline) -> None:
                v = int(cast(bytes, pipe.get("tx:counter")))
                pipe.multi()
                pipe.set("tx:counter", v + 1)
            r.transaction(bump, "tx:counter")
    finally:
        stop.set()
        t.join()
    assert r.get("tx:counter") == b"50"


def test_queue_errors_abort_exec(server: Server, r: redis.Redis) -> None:
    conn = redis.Connection(host=server.resp_host, port=server.resp_port)
    try:
        conn.send_command("MULTI")
        assert conn.read_response() == b"OK"
        conn.send_command("SET", "tx:never", "1")
        assert conn.read_response() == b"QUEUED"
        conn.send_command("NOSUCHCOMMAND")
        with pytest.raises(redis.ResponseError):
            conn.read_response()
        conn.send_command("EXEC")
        with pytest.raises(redis.exceptions.ExecAbortError):
            conn.read_response()
    finally:
        conn.disconnect()
    assert r.exists("tx:never") == 0


def test_string_commands(r: redis.Redis) -> None:
    r.delete("s:k", "s:n", "s:f")
    assert r.setex("s:k", 100, "v") is True
    assert 99 <= r.ttl("s:k") <= 100
    assert r.psetex("s:k", 5000, "v") is True
    assert r.setnx("s:n", "1") is True
    assert r.setnx("s:n", "2") is False
    assert r.msetnx({"s:m1": "1", "s:m2": "2"}) is True
    assert r.msetnx({"s:m2": "x", "s:m3": "3"}) is False
    assert r.exists("s:m3") == 0
    assert r.getex("s:k", ex=50) == b"v"
    assert 49 <= r.ttl("s:k") <= 50
    assert r.getex("s:k", persist=True) == b"v"
    assert r.ttl("s:k") == -1
    assert r.getset("s:k", "w") == b"v"
    assert r.append("s:k", "xyz") == 4
    assert r.getrange("s:k", 1, -1) == b"xyz"
    assert r.setrange("s:k", 1, "XY") == 4
    assert r.get("s:k") == b"wXYz"
    assert r.getdel("s:k") == b"wXYz"
    assert r.get("s:k") is None
    r.set("s:f", "10.50")
    assert r.incrbyfloat("s:f", 0.1) == pytest.approx(10.6)
    assert r.get("s:f") == b"10.6"
    r.mset({"s:l1": "ohmytext", "s:l2": "mynewtext"})
    assert r.lcs("s:l1", "s:l2") == b"mytext"
    assert r.lcs("s:l1", "s:l2", len=True) == 6


def test_expiry_commands(r: redis.Redis) -> None:
    r.set("e:k", "v")
    at = int(time.time()) + 1000
    assert r.expireat("e:k", at) is True
    assert abs(r.expiretime("e:k") - at) <= 1
    assert r.expire("e:k", 100, lt=True, xx=True) is True
    assert r.expire("e:k", 200, lt=True, xx=True) is False
    assert r.expire("e:k", 300, gt=True) is True
    assert 299 <= r.ttl("e:k") <= 300
    with pytest.raises(redis.ResponseError, match="invalid expire time in 'expire'"):
        r.expire("e:k", -9223372036854776)
    assert r.exists("e:k") == 1
    assert r.pexpireat("e:k", int(time.time() * 1000) + 60_000) is True
    assert r.pexpiretime("e:k") > int(time.time() * 1000)


def test_keyspace_commands(r: redis.Redis) -> None:
    r.flushdb(asynchronous=True)
    assert r.dbsize() == 0
    assert r.randomkey() is None
    names = [f"ks:{i}" for i in range(250)]
    r.mset({n: n for n in names})
    assert sorted(r.scan_iter(match="ks:*", count=20)) == sorted(n.encode() for n in names)
    assert len(r.keys("ks:1?")) == 10
    assert r.exists("ks:1", "ks:1", "ks:none") == 2
    assert r.touch("ks:1", "ks:none") == 1
    assert r.type("ks:1") == b"string"
    assert r.type("ks:none") == b"none"
    assert r.rename("ks:1", "ks:one") is True
    assert r.renamenx("ks:one", "ks:2") is False
    assert r.copy("ks:one", "ks:copy") is True
    assert r.copy("ks:one", "ks:copy") is False
    assert r.copy("ks:one", "ks:copy", replace=True) is True
    assert r.get("ks:copy") == b"ks:1"
    assert r.unlink("ks:copy", "ks:none") == 1
    assert cast(bytes, r.randomkey()).startswith(b"ks:")
    with pytest.raises(redis.ResponseError, match="no such key"):
        r.rename("ks:none", "ks:x")
    assert r.flushall() is True
    assert r.dbsize() == 0


def test_transaction_is_atomic_for_a_reader(r: redis.Redis, r2: redis.Redis) -> None:
    keys = [f"atom:{i}" for i in range(50)]
    stop = threading.Event()
    torn = []

    def read() -> None:
        while not stop.is_set():
            values = r2.mget(keys)
            if len(set(values)) != 1:
                torn.append(values)

    r.mset({k: "start" for k in keys})
    t = threading.Thread(target=read)
    t.start()
    try:
        for gen in range(100):
            with r.pipeline() as p:
                for k in keys:
                    p.set(k, gen)
                p.execute()
    finally:
        stop.set()
        t.join()
    assert torn == []

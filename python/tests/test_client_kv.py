"""The `fabrickv` Python module's key-value client against a live
`fabrickv serve`, once per native transport (tcp and shm): what a Python
user relies on, from round trips of binary values to errors with stable
codes and calls that let other threads run.

Needs `make python` (the module in .venv) and `make build` (the server)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from typing import Callable, Iterator

import pytest

from conftest import TRANSPORTS, Server, listen_addr

try:
    import fabrickv
except ImportError as e:  # a missing build fails the run, never skips it
    pytest.fail(f"the fabrickv module is not installed ({e}): run `make python`",
                pytrace=False)

# The engine's bound on a value (VALUE_BYTES_MAX), which a server reports.
VALUE_BYTES_MAX = 1 << 20
# The largest value at all (Redis's 512 MiB), carried in chunks.
LARGE_VALUE_BYTES_MAX = 512 << 20

# How long a condition that should come true soon may take before the test
# fails; generous, as the machine may be busy.
DEADLINE_S = 10.0


# A test's key maker (the `key` fixture).
Key = Callable[[str], bytes]


@pytest.fixture
def client(kv_server: Server) -> Iterator[fabrickv.Client]:
    with fabrickv.Client(kv_server.native, timeout=5.0) as c:
        yield c


@pytest.fixture
def key() -> Key:
    """A fresh key prefix per test, so tests sharing a server never meet."""
    prefix = f"py-{uuid.uuid4().hex[:16]}-".encode()
    return lambda name: prefix + name.encode()


def silent_listener(transport: str) -> tuple[socket.socket, str]:
    """A socket that accepts connections (the kernel completes them) but
    never answers: a server that hangs. Returns (socket, address)."""
    if transport == "tcp":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        return s, "%s:%d" % s.getsockname()
    # shm rendezvous: an abstract unix socket named "fabrickv-shm-" + NAME
    # (SOCKET_NAME_PREFIX in crates/transport-shm).
    name = f"fkv-py-silent-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0fabrickv-shm-" + name)
    s.listen(64)
    return s, "shm://" + name


def dead_address(transport: str) -> str:
    """An address where nothing listens."""
    if transport == "tcp":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return f"127.0.0.1:{port}"
    return f"shm://fkv-py-nobody-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def test_connects_to_the_address_the_server_printed(
        kv_server: Server, client: fabrickv.Client) -> None:
    info = client.info()
    assert info["workers"] == 2
    assert info["partitions"] >= info["workers"]
    assert info["mode"] == "store"
    assert info["value_bytes_max"] == VALUE_BYTES_MAX
    assert info["key_bytes_max"] == 250
    assert info["batch_ops_max"] > 0
    assert info["timeout"] == 5.0
    assert client.addr == kv_server.native
    assert kv_server.native.startswith(f"{kv_server.transport}://")
    r = repr(client)
    assert r.startswith("<fabrickv.Client") and kv_server.native in r


def test_put_get_round_trips_binary_values(client: fabrickv.Client, key: Key) -> None:
    values = {
        "empty": b"",
        "nul-and-high-bytes": bytes(range(256)) * 3,
        "utf8": "grüße, 世界".encode(),
        "limit": os.urandom(VALUE_BYTES_MAX),
    }
    for name, value in values.items():
        client.put(key(name), value)
    for name, value in values.items():
        got = client.get(key(name))
        assert type(got) is bytes, name
        assert got == value, name
    # Binary keys too, including NUL bytes.
    binary_key = key("\x00\xff")
    client.put(binary_key, b"v")
    assert client.get(binary_key) == b"v"


def test_put_replaces_the_value(client: fabrickv.Client, key: Key) -> None:
    client.put(key("k"), b"first")
    client.put(key("k"), b"second, longer than the first")
    assert client.get(key("k")) == b"second, longer than the first"


def test_values_over_one_frame_round_trip_and_over_the_limit_are_refused(client: fabrickv.Client,
                                                                         key: Key) -> None:
    # Over VALUE_BYTES_MAX a value travels in chunks, every byte kept.
    big = bytes(range(256)) * (4 * VALUE_BYTES_MAX // 256) + b"tail"
    client.put(key("big"), big)
    assert client.get(key("big")) == big
    with pytest.raises(fabrickv.Error) as e:
        client.put(key("huge"), b"x" * (LARGE_VALUE_BYTES_MAX + 1))
    assert e.value.code == "VALUE_TOO_LARGE"
    assert "VALUE_TOO_LARGE" in str(e.value)
    assert isinstance(e.value, Exception)
    # Refused means not stored, and the connection is still good.
    assert client.get(key("huge")) is None
    client.put(key("after"), b"ok")
    assert client.get(key("after")) == b"ok"


def test_key_over_the_limit_is_refused_with_its_code(client: fabrickv.Client) -> None:
    with pytest.raises(fabrickv.Error) as e:
        client.get(b"k" * 251)
    assert e.value.code == "KEY_TOO_LONG"


def test_missing_key_reads_as_none(client: fabrickv.Client, key: Key) -> None:
    assert client.get(key("never-stored")) is None


def test_delete_says_whether_the_key_was_there(client: fabrickv.Client, key: Key) -> None:
    client.put(key("d"), b"v")
    assert client.delete(key("d")) is True
    assert client.get(key("d")) is None
    assert client.delete(key("d")) is False


def test_mget_keeps_order_with_misses(client: fabrickv.Client, key: Key) -> None:
    # Enough keys that they spread over both workers.
    present = {key(f"m{i}"): f"value {i}".encode() for i in range(0, 64, 2)}
    client.mput(list(present.items()))
    asked = [key(f"m{i}") for i in range(64)]
    got = client.mget(asked)
    assert got == [present.get(k) for k in asked]
    assert client.mget([]) == []


def test_mput_takes_pairs_a_dict_or_keys_and_values(client: fabrickv.Client, key: Key) -> None:
    client.mput([(key("a"), b"1"), (key("b"), b"2")])
    client.mput({key("c"): b"3"})
    client.mput([key("d"), key("e")], [b"4", b""])
    assert client.mget([key(n) for n in "abcde"]) == [b"1", b"2", b"3", b"4", b""]
    with pytest.raises(ValueError):
        client.mput([key("f")], [b"1", b"2"])
    assert client.get(key("f")) is None


def test_wrong_argument_types_raise_type_error(client: fabrickv.Client) -> None:
    with pytest.raises(TypeError):
        client.get("a str is not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.put(b"k", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.mget([b"ok", "not bytes"])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        client.put(b"k", b"v", ttl=-1)
    with pytest.raises(ValueError):
        client.put(b"k", b"v", ttl=float("nan"))


def test_ttl_expires_the_value(client: fabrickv.Client, key: Key) -> None:
    ttl_s = 0.5
    start = time.monotonic()
    client.put(key("short"), b"soon gone", ttl=ttl_s)
    client.put(key("forever"), b"stays")
    client.mput([(key("batch"), b"also gone")], ttl=ttl_s)
    # Wait for the expiry by polling, with a deadline.
    deadline = start + DEADLINE_S
    while client.get(key("short")) is not None:
        assert time.monotonic() < deadline, "the value outlived its TTL"
        time.sleep(0.02)
    gone_after = time.monotonic() - start
    # The server counts the TTL from when it stored the value, which is
    # after `start`: the value cannot have gone before the TTL ran out.
    assert gone_after >= ttl_s - 0.01
    while client.get(key("batch")) is not None:
        assert time.monotonic() < deadline, "the mput value outlived its TTL"
        time.sleep(0.02)
    assert client.get(key("forever")) == b"stays"


def test_ttl_is_not_applied_early(client: fabrickv.Client, key: Key) -> None:
    client.put(key("long"), b"v", ttl=3600)
    assert client.get(key("long")) == b"v"


def test_stats_count_operations(client: fabrickv.Client, key: Key) -> None:
    before = client.stats()
    assert all(type(v) is int for v in before.values())
    client.mput([(key("s1"), b"1"), (key("s2"), b"2"), (key("s3"), b"3")])
    assert client.get(key("s1")) == b"1"
    assert client.get(key("s2")) == b"2"
    assert client.get(key("missing")) is None
    assert client.delete(key("s3"))
    after = client.stats()
    delta = {k: after[k] - before[k] for k in ("puts", "gets", "hits", "misses", "deletes")}
    assert delta == {"puts": 3, "gets": 3, "hits": 2, "misses": 1, "deletes": 1}
    assert after["workers"] == 2
    assert after["items"] >= 2
    assert after["conns_open"] >= 2, "this client holds one connection per worker"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dead_address_fails_fast(transport: str) -> None:
    start = time.monotonic()
    with pytest.raises(fabrickv.Error) as e:
        fabrickv.Client(dead_address(transport), timeout=5.0)
    assert e.value.code == "UNAVAILABLE"
    assert time.monotonic() - start < 2.0, "refused, not left to time out"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_silent_server_times_out(transport: str) -> None:
    listener, addr = silent_listener(transport)
    with listener:
        start = time.monotonic()
        with pytest.raises(fabrickv.Error) as e:
            fabrickv.Client(addr, timeout=0.3)
        took = time.monotonic() - start
    assert e.value.code == "TIMEOUT"
    assert 0.25 <= took < 5.0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_blocked_calls_release_the_gil(transport: str) -> None:
    # Four threads each wait `timeout` on a server that never answers. If
    # a call held the GIL they would wait one after another (4 x timeout);
    # with it released they wait together (about 1 x timeout).
    timeout_s, threads = 1.0, 4
    listener, addr = silent_listener(transport)
    codes = []

    def call() -> None:
        try:
            fabrickv.Client(addr, timeout=timeout_s)
        except fabrickv.Error as e:
            codes.append(e.code)

    with listener:
        start = time.monotonic()
        ts = [threading.Thread(target=call) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=DEADLINE_S)
        took = time.monotonic() - start
    assert codes == ["TIMEOUT"] * threads
    assert took < 2.5 * timeout_s, f"{threads} blocked calls took {took:.2f}s: run in turn"


def freeze(pid: int) -> None:
    """SIGSTOPs `pid` and returns once every thread of it is stopped: kill()
    returns before the signal has taken effect, and a server still running
    for a moment would answer the calls meant to wait."""
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
    # The same for data calls: connected clients whose server is then
    # frozen (SIGSTOP) wait out their timeout together, not in turn.
    timeout_s, threads = 1.0, 4
    server = Server(listen=listen_addr(transport))
    clients = [fabrickv.Client(server.native, timeout=timeout_s) for _ in range(threads)]
    codes = []

    def call(c: fabrickv.Client) -> None:
        try:
            c.get(b"k")
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


def test_threads_with_their_own_clients_run_together(kv_server: Server, key: Key) -> None:
    errors = []

    def worker(n: int) -> None:
        try:
            with fabrickv.Client(kv_server.native) as c:
                for i in range(200):
                    k = key(f"t{n}-{i}")
                    c.put(k, k * 3)
                    assert c.get(k) == k * 3
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    assert errors == []


def test_one_client_shared_by_threads(client: fabrickv.Client, key: Key) -> None:
    # Calls on one client take turns; none is lost or crossed with another.
    errors = []

    def worker(n: int) -> None:
        try:
            for i in range(100):
                k = key(f"shared{n}-{i}")
                client.put(k, k)
                assert client.mget([k, key("absent")]) == [k, None]
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    assert errors == []


def test_closed_client_refuses_calls(kv_server: Server) -> None:
    with fabrickv.Client(kv_server.native) as c:
        assert not c.closed
    assert c.closed
    assert "closed" in repr(c)
    with pytest.raises(fabrickv.Error) as e:
        c.get(b"k")
    assert e.value.code == "UNAVAILABLE"
    c.close()  # closing again is harmless


def test_with_block_closes_on_error(kv_server: Server) -> None:
    with pytest.raises(RuntimeError):
        with fabrickv.Client(kv_server.native) as c:
            raise RuntimeError("boom")
    assert c.closed


def test_error_code_names_are_on_the_class() -> None:
    assert issubclass(fabrickv.Error, Exception)
    # An Error made in Python has no code; ones the client raises do.
    assert fabrickv.Error("x").code is None

"""Fixtures: a FabricKV server started per test module, on loopback ports
the kernel picks (or a fresh shared-memory name), from the binary `make
build` produces (or $FABRICKV_BIN)."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence, TypeVar

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("FABRICKV_BIN", ROOT / "target" / "release" / "fabrickv"))

# How long a server may take to print its addresses.
START_TIMEOUT_S = 20.0


# The native transports a client outside the server's process can reach.
TRANSPORTS = ("tcp", "shm")

# A small embedding pool (64 MiB) backed lazily (no mlock, no zeroing, no
# prefaulting), so a server for the table tests starts at once and needs
# neither locked memory nor 1 GiB of RAM.
PS_POOL_ARGS = ("--dram-pool-gb", "0.0625", "--dram-skip-mlock",
                "--dram-skip-memset", "--dram-skip-populate")


def value_bytes(got: object) -> bytes | None:
    """The bytes of what a cache `get` without `out=` returned, once
    checked to be what the package promises: None for an absent key, else
    a new 1-D uint8 numpy array that owns its memory (not a view of the
    client's receive buffer, which the next read reuses)."""
    if got is None:
        return None
    assert isinstance(got, np.ndarray), type(got)
    assert got.dtype == np.uint8 and got.ndim == 1, (got.dtype, got.shape)
    assert got.flags.owndata and got.flags.writeable and got.flags.c_contiguous
    return got.tobytes()


def listen_addr(transport: str) -> str:
    """A `--listen` address for `transport` that no other server uses."""
    if transport == "tcp":
        return "127.0.0.1:0"
    if transport == "shm":
        return f"shm://fkv-py-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    raise ValueError(f"unknown transport {transport!r}")


class Server:
    """A `fabrickv serve` child process; stopped with SIGTERM.

    `native` is the address native clients connect to, as the banner
    prints it (`tcp://127.0.0.1:PORT` or `shm://NAME`)."""

    # The transport a fixture started it on ("tcp", "shm"), where one did.
    transport: str
    memcache_port: int | None

    def __init__(self, *extra: str, listen: str = "127.0.0.1:0", workers: int = 2,
                 env: dict[str, str] | None = None) -> None:
        if not BIN.exists():
            pytest.fail(f"{BIN} is missing: run `make build` first")
        # The gRPC control plane's default address must bind or the server
        # refuses to start; tests start many servers, so theirs is off
        # unless a test names one.
        grpc = () if "--grpc" in extra else ("--grpc", "off")
        self.proc = subprocess.Popen(
            [str(BIN), "serve", "--listen", listen, "--resp", "127.0.0.1:0",
             "--workers", str(workers), "--memory", "64MB", "--log-level", "warn",
             *grpc, *extra],
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.native, self.resp_host, self.resp_port = self._addresses()

    def _addresses(self) -> tuple[str, str, int]:
        # The banner is printed once the server listens on both addresses;
        # the memcache front end's line, when it is on, comes before it.
        deadline = time.monotonic() + START_TIMEOUT_S
        pattern = re.compile(r"serving on (\S+), RESP on (\S+):(\d+)")
        memcache = re.compile(r"memcache on \S+:(\d+)")
        self.memcache_port = None
        while time.monotonic() < deadline:
            assert self.proc.stderr is not None
            line = self.proc.stderr.readline()
            if not line:
                break
            m = memcache.search(line)
            if m:
                self.memcache_port = int(m.group(1))
            m = pattern.search(line)
            if m:
                return m.group(1), m.group(2), int(m.group(3))
        self.stop()
        pytest.fail("fabrickv serve did not print its addresses")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    assert s.stop() == 0, "the server exits cleanly on SIGTERM"


def one_try() -> Any:
    """A redis-py retry policy of a single attempt. redis-py 8 retries a
    refused password ten times by default (over 3-5 s), and the server
    counts each as a failed authentication from 127.0.0.1: tests that
    send a wrong password on purpose send it once, so that the module's
    failures stay inside the server's per-source allowance whatever the
    machine's speed."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


@pytest.fixture(scope="module")
def auth_server() -> Iterator[Server]:
    # The password comes from the environment, never the command line
    # (where every user of the host could read it).
    s = Server(env={"FABRICKV_RESP_PASSWORD": "s3cret pass"})
    yield s
    s.stop()


@pytest.fixture(scope="module", params=TRANSPORTS)
def kv_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """A server per native transport: each test using it runs once on tcp
    and once on shm."""
    s = Server(listen=listen_addr(request.param))
    s.transport = request.param
    yield s
    assert s.stop() == 0, "the server exits cleanly on SIGTERM"


@pytest.fixture(scope="module", params=TRANSPORTS)
def ps_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """A server per native transport with a small embedding pool, for the
    table tests: each test using it runs once on tcp and once on shm."""
    s = Server(*PS_POOL_ARGS, listen=listen_addr(request.param))
    s.transport = request.param
    yield s
    assert s.stop() == 0, "the server exits cleanly on SIGTERM"


def start_servers(n: int, transport: str, *extra: str) -> list[Server]:
    """`n` servers on `transport`, one worker each, with a small embedding
    pool (for the cluster tests); `extra` goes to every one. Stopped by
    the caller (`stop_all`)."""
    servers = []
    try:
        for _ in range(n):
            s = Server(*PS_POOL_ARGS, *extra, listen=listen_addr(transport), workers=1)
            s.transport = transport
            servers.append(s)
    except BaseException:
        stop_all(servers)
        raise
    return servers


def stop_all(servers: Sequence[Server]) -> list[int]:
    """Stops every server; their exit codes, in order."""
    return [s.stop() for s in servers]


ServerT = TypeVar("ServerT", bound=Server)


def start_slot_cluster(make: type[ServerT], etcd: Etcd, name: str, transport: str,
                       count: int, size: int) -> list[ServerT]:
    """Servers 0 to `count - 1` of etcd cluster `name` (`--cluster-size
    size`, one copy of each slot, a memcache front end each) listening on
    `transport`; those started are stopped if one fails to start."""
    servers: list[ServerT] = []
    try:
        for i in range(count):
            servers.append(make(
                "--registry", etcd.url, "--cluster", name, "--id", str(i),
                "--cluster-size", str(size), "--memcache", "127.0.0.1:0",
                listen=listen_addr(transport), workers=1))
    except BaseException:
        stop_all(servers)
        raise
    return servers


@pytest.fixture(scope="module", params=TRANSPORTS)
def cluster_servers(request: pytest.FixtureRequest) -> Iterator[list[Server]]:
    """Three servers per native transport, for the cluster clients: each
    test using them runs once on tcp and once on shm."""
    servers = start_servers(3, request.param)
    yield servers
    assert stop_all(servers) == [0, 0, 0], "the servers exit cleanly on SIGTERM"


class Memcached:
    """A memcached child process on a free loopback port (the cluster
    registry), as the Rust tests' LocalMemcached starts it; killed by
    `stop`."""

    def __init__(self) -> None:
        import shutil
        import socket
        if shutil.which("memcached") is None:
            pytest.fail("memcached is missing: run `make deps`")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        args = ["memcached", "-l", "127.0.0.1", "-p", str(self.port), "-U", "0", "-m", "64"]
        if os.geteuid() == 0:
            args += ["-u", "root"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL)
        self.url = f"memcached://127.0.0.1:{self.port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    pytest.fail(f"memcached exited at start: {self.proc.returncode}")
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail("memcached did not accept connections")
                time.sleep(0.005)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Etcd:
    """A one-member etcd on free loopback ports with a data directory of
    its own (the registry of replicated clusters), as the Rust tests'
    LocalEtcd starts it; killed, and its directory removed, by `stop`."""

    def __init__(self, tmp_dir: Path) -> None:
        import shutil
        import socket
        import urllib.request
        if shutil.which("etcd") is None:
            pytest.fail("etcd is missing: run `make deps`")
        # Both ports held at once, so that they differ.
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            b.bind(("127.0.0.1", 0))
            self.port, peer = a.getsockname()[1], b.getsockname()[1]
        client_url = f"http://127.0.0.1:{self.port}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.dir = tmp_dir
        self.proc = subprocess.Popen(
            ["etcd", "--name=fkv", f"--data-dir={tmp_dir}",
             f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
             f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
             f"--initial-cluster=fkv={peer_url}", "--log-level=error"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"etcd://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 3 * START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=2) as r:
                    if b'"health":"true"' in r.read():
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                pytest.fail(f"etcd exited at start: {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail("etcd did not become healthy")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    e = Etcd(tmp_path_factory.mktemp("etcd"))
    yield e
    e.stop()


@pytest.fixture(scope="module")
def memcached() -> Iterator[Memcached]:
    m = Memcached()
    yield m
    m.stop()

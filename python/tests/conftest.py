"""Fixtures: a FabricKV server started per test module, on loopback ports
the kernel picks (or a fresh shared-memory name), from the binary `make
build` produces (or $FABRICKV_BIN)."""

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

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


def listen_addr(transport):
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

    def __init__(self, *extra, listen="127.0.0.1:0"):
        if not BIN.exists():
            pytest.fail(f"{BIN} is missing: run `make build` first")
        self.proc = subprocess.Popen(
            [str(BIN), "serve", "--listen", listen, "--resp", "127.0.0.1:0",
             "--workers", "2", "--memory", "64MB", "--log-level", "warn", *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.native, self.resp_host, self.resp_port = self._addresses()

    def _addresses(self):
        # The banner is printed once the server listens on both addresses.
        deadline = time.monotonic() + START_TIMEOUT_S
        pattern = re.compile(r"serving on (\S+), RESP on (\S+):(\d+)")
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = pattern.search(line)
            if m:
                return m.group(1), m.group(2), int(m.group(3))
        self.stop()
        pytest.fail("fabrickv serve did not print its addresses")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    assert s.stop() == 0, "the server exits cleanly on SIGTERM"


@pytest.fixture(scope="module")
def auth_server():
    s = Server("--resp-password", "s3cret pass")
    yield s
    s.stop()


@pytest.fixture(scope="module", params=TRANSPORTS)
def kv_server(request):
    """A server per native transport: each test using it runs once on tcp
    and once on shm."""
    s = Server(listen=listen_addr(request.param))
    s.transport = request.param
    yield s
    assert s.stop() == 0, "the server exits cleanly on SIGTERM"


@pytest.fixture(scope="module", params=TRANSPORTS)
def ps_server(request):
    """A server per native transport with a small embedding pool, for the
    table tests: each test using it runs once on tcp and once on shm."""
    s = Server(*PS_POOL_ARGS, listen=listen_addr(request.param))
    s.transport = request.param
    yield s
    assert s.stop() == 0, "the server exits cleanly on SIGTERM"

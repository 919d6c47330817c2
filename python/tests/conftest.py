"""Fixtures: a FabricKV server started per test module, on loopback ports
the kernel picks, from the binary `make build` produces (or $FABRICKV_BIN)."""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("FABRICKV_BIN", ROOT / "target" / "release" / "fabrickv"))

# How long a server may take to print its addresses.
START_TIMEOUT_S = 20.0


class Server:
    """A `fabrickv serve` child process; stopped with SIGTERM."""

    def __init__(self, *extra):
        if not BIN.exists():
            pytest.fail(f"{BIN} is missing: run `make build` first")
        self.proc = subprocess.Popen(
            [str(BIN), "serve", "--listen", "127.0.0.1:0", "--resp", "127.0.0.1:0",
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

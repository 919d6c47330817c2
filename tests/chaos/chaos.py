#!/usr/bin/env python3
"""The fault test: a FabricKV cluster in etcd under faults, while clients
write and read, its history checked for linearizability and lost writes.

It starts etcd and N `fabrickv serve` processes (and, with replicas, the
failover controller), then for --seconds runs clients, half through
redis-py's RedisCluster and half through `fabrickv.Cluster`, over a few
keys so that operations conflict, every write a value of its own. Each
operation's invocation and completion (time.monotonic_ns, one clock for
every thread) goes into the history; one that failed in any way is
recorded as of unknown outcome. Meanwhile it injects faults, one at a
time: kill -9 (restart after a while), SIGSTOP (SIGCONT after a while),
network isolation of one server, and a resize: one spare server runs
beside the N, and a resize adds it (`fabrickv cluster add`: slots move to
it while every server serves) or, when it is in, removes a member
(`fabrickv cluster remove`), which becomes the spare. At the end it heals everything,
waits for the cluster to serve every key, reads every key through both
kinds of client, checks that no acknowledged write was lost, and runs
the linearizability checker (tools/linearizability, porcupine) on the
whole history. Beside them, a table client pushes to an embedding table,
each push adding 1 to one row; at the end each row must hold at least
the pushes acknowledged and at most those plus the ones of unknown
outcome (fewer: a lost push; more: a push applied twice). See
docs/chaos.md.

Run it with the project's venv (`make python`):
    .venv/bin/python tests/chaos/chaos.py --seconds 60 --faults kill,stop,isolate
Exit status: 0 when the history is linearizable and no write was lost, 1
when not (or the check could not decide, or a server crashed), 2 when the
harness itself could not run.
"""

import argparse
import binascii
import ipaddress
import json
import math
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("FABRICKV_BIN", ROOT / "target" / "release" / "fabrickv"))
CHECKER_SRC = ROOT / "tools" / "linearizability"

FAULT_KINDS = ("kill", "stop", "isolate", "resize")
# Seconds between one fault's end and the next one's start, and how long
# each kind lasts (uniform between the bounds).
FAULT_GAP_S = (1.0, 5.0)
KILL_DOWN_S = (0.5, 5.0)
STOP_S = (0.2, 3.0)
ISOLATE_S = (1.0, 10.0)
# Each client call's timeout (both kinds of client).
OP_TIMEOUT_S = 2.0
# How long a move of slots (`cluster add` / `cluster remove`) may take.
RESIZE_TIMEOUT_S = 120.0
# How long a (re)started server may take to print its banner.
START_TIMEOUT_S = 60.0
# How long the healed cluster may take to serve every key again.
SETTLE_TIMEOUT_S = 180.0
# Share of the clients' operations that are writes.
WRITE_SHARE = 0.5
# Exit code of a server that found it was deposed (a new map leaves it out
# of the groups it led): the harness restarts it, and it rejoins.
EXIT_DEPOSED = 75
REDIS_SLOTS = 16384
# The table the pusher adds to: rows, floats per row, and the small
# embedding pool each server gets (backed lazily).
TABLE = "chaos-counts"
TABLE_ROWS = 16
TABLE_DIM = 4
PS_POOL_ARGS = ["--dram-pool-gb", "0.0625", "--dram-skip-mlock", "--dram-skip-memset",
                "--dram-skip-populate"]
# A row's value is its count plus the initializer's start (|x| < 0.01)
# and f32 rounding: a count is read as the nearest integer, if this near.
COUNT_TOLERANCE = 0.05


def log(msg):
    print(f"chaos: {msg}", flush=True)


class HarnessError(Exception):
    """The harness could not do its part (a start, a setup): no verdict."""


def now_ns():
    return time.monotonic_ns()


def free_ports(host, n):
    """`n` distinct free TCP ports on `host`, all held at once while
    chosen so that they differ (and released before use, as conftest
    does)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def reachable(host, port, timeout=0.5):
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def run_ip(*args):
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise HarnessError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def slot_of(key):
    """Redis Cluster's hash slot: CRC16 (XMODEM, which crc_hqx with 0 is)
    of the key, or of its {hash tag}, modulo 16,384."""
    b = key.encode()
    open_ = b.find(b"{")
    if open_ >= 0:
        close = b.find(b"}", open_ + 1)
        if close > open_ + 1:
            b = b[open_ + 1:close]
    return binascii.crc_hqx(b, 0) % REDIS_SLOTS


def pick_keys(count, servers, prefix="chaos:"):
    """`count` keys spread evenly over the servers' initial slot runs (the
    first map gives server i the i-th of N equal runs), so that every
    server holds some of the keys the faults can hurt."""
    want = [count // servers + (1 if i < count % servers else 0) for i in range(servers)]
    keys, j = [], 0
    while len(keys) < count:
        k = f"{prefix}{j}"
        j += 1
        owner = min(slot_of(k) * servers // REDIS_SLOTS, servers - 1)
        if want[owner] > 0:
            want[owner] -= 1
            keys.append(k)
    return keys


# ---------------------------------------------------------------- networks

class Loopback:
    """Every process on 127.0.0.1, each server on ports of its own. It
    cannot isolate a server (they share the loopback interface)."""

    kind = "loopback"

    def __init__(self, servers):
        ports = free_ports("127.0.0.1", 2 * servers)
        self.etcd_host = "127.0.0.1"
        self.addrs = [("127.0.0.1", ports[2 * i], ports[2 * i + 1]) for i in range(servers)]

    def server(self, i):
        """(host, native port, RESP port) of server i."""
        return self.addrs[i]

    def wrap(self, i, argv):
        return argv

    def isolate(self, i):
        raise HarnessError("a loopback cluster cannot isolate a server (use --net netns)")

    heal = isolate

    def close(self):
        pass


class Namespaces:
    """Each server in a network namespace of its own, all joined by a
    bridge (the switch) in one more namespace; the root namespace, where
    etcd, the controller, the clients and this script run, has one port on
    the switch through a veth pair, with the subnet's first address.

    Isolating server i sets its switch port down: it then reaches nothing
    (not etcd, not the other servers) and nothing reaches it, until healed.
    Nothing is routed or forwarded: the only route the root namespace gains
    is the new subnet's own, on a subnet no existing route overlaps, so no
    packet leaves these interfaces. The switch sits outside the root
    namespace, so deleting the namespaces deletes every interface made."""

    kind = "netns"
    NATIVE_PORT = 7379
    RESP_PORT = 7380

    def __init__(self, servers):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise HarnessError("network namespaces need root and iproute2's ip (or use --net loopback)")
        # Names hold the pid so that runs side by side never share one;
        # an interface name is at most 15 bytes.
        self.prefix = f"fkc{os.getpid() % 100000}"
        self.hub = f"{self.prefix}-hub"
        self.uplink = f"{self.prefix}r"
        self.namespaces = []
        net = self._free_subnet()
        self.etcd_host = str(net[1])
        self.addrs = [(str(net[10 + i]), self.NATIVE_PORT, self.RESP_PORT) for i in range(servers)]
        try:
            self._build(servers, net)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _free_subnet():
        """A 10.213.X.0/24 that overlaps no route of the root namespace."""
        routes = json.loads(run_ip("-j", "-4", "route", "show", "table", "all"))
        taken = []
        for r in routes:
            dst = r.get("dst", "default")
            if dst != "default":
                taken.append(ipaddress.ip_network(dst, strict=False))
        start = os.getpid() % 200
        for k in range(250):
            cand = ipaddress.ip_network(f"10.213.{(start + k) % 250}.0/24")
            if not any(cand.overlaps(t) for t in taken):
                return cand
        raise HarnessError("no free 10.213.X.0/24 subnet")

    def _ns(self, i):
        return f"{self.prefix}-s{i}"

    def _build(self, servers, net):
        run_ip("netns", "add", self.hub)
        self.namespaces.append(self.hub)
        run_ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        run_ip("-n", self.hub, "link", "set", "br0", "up")
        run_ip("link", "add", self.uplink, "type", "veth", "peer", "name", "uplink", "netns", self.hub)
        run_ip("-n", self.hub, "link", "set", "dev", "uplink", "master", "br0", "up")
        run_ip("addr", "add", f"{self.etcd_host}/{net.prefixlen}", "dev", self.uplink)
        run_ip("link", "set", self.uplink, "up")
        for i in range(servers):
            ns = self._ns(i)
            run_ip("netns", "add", ns)
            self.namespaces.append(ns)
            run_ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"s{i}",
                   "netns", self.hub)
            run_ip("-n", self.hub, "link", "set", "dev", f"s{i}", "master", "br0", "up")
            run_ip("-n", ns, "addr", "add", f"{self.addrs[i][0]}/{net.prefixlen}", "dev", "eth0")
            run_ip("-n", ns, "link", "set", "eth0", "up")
            run_ip("-n", ns, "link", "set", "lo", "up")

    def server(self, i):
        return self.addrs[i]

    def wrap(self, i, argv):
        # `ip netns exec` switches namespace and execs the command: the
        # child's pid is the server's, for the signals the faults send.
        return ["ip", "netns", "exec", self._ns(i), *argv]

    def isolate(self, i):
        run_ip("-n", self.hub, "link", "set", "dev", f"s{i}", "down")
        # Proof that it is cut off: its RESP port no longer answers.
        host, _, resp = self.addrs[i]
        if reachable(host, resp):
            raise HarnessError(f"server {i} still answers at {host}:{resp} with its switch port down")

    def heal(self, i):
        run_ip("-n", self.hub, "link", "set", "dev", f"s{i}", "up")

    def close(self):
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        # The uplink goes with the hub namespace, but only once the kernel
        # frees it: delete it now so that it is gone when this returns.
        subprocess.run(["ip", "link", "del", self.uplink], capture_output=True)
        self.namespaces = []


# --------------------------------------------------------------- processes

class Proc:
    """A child process the harness starts, and restarts with the same
    arguments; its output appended to one log file over every start."""

    def __init__(self, name, argv, env, log_path, banner=None):
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.banner = banner
        self.proc = None
        self.starts = 0
        self.exits = []          # every exit code seen (negative: a signal)
        self.hold = False        # a kill fault keeps it down until released
        self.restart_at = 0.0    # earliest restart after an exit of its own
        self.backoff = 0.5       # delay before that restart, doubled while it keeps exiting
        self.started_at = 0.0
        self._log_offset = 0

    def start(self):
        with open(self.log_path, "ab") as f:
            self._log_offset = f.tell()
            f.write(f"==== chaos: start {self.starts + 1} of {self.name}: {' '.join(self.argv)}\n".encode())
            f.flush()
            # A session of its own: a Ctrl-C at the terminal reaches the
            # harness alone, which then tears everything down in order.
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        self.started_at = time.monotonic()

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def ready(self):
        """Whether this start has printed its banner (the server prints it
        once it listens and is registered), or, without one, is running."""
        if not self.running():
            return False
        if self.banner is None:
            return True
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return self.banner in f.read()

    def wait_ready(self, timeout, stop=None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return True
            if stop is not None and stop.is_set():
                return False
            time.sleep(0.02)
        return False

    def signal(self, sig):
        if self.running():
            self.proc.send_signal(sig)

    def kill(self):
        """SIGKILL and reap (a stopped process dies of SIGKILL too)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines=15):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Etcd:
    """A one-member etcd on `host` with a data directory in the run
    directory, as python/tests/conftest.py's Etcd starts it."""

    def __init__(self, host, run_dir):
        if shutil.which("etcd") is None:
            raise HarnessError("etcd is missing: run `make deps`")
        client_port = free_ports(host, 1)[0]
        peer_port = free_ports("127.0.0.1", 1)[0]
        client_url = f"http://{host}:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self.url = f"etcd://{host}:{client_port}"
        self.log = open(run_dir / "etcd.log", "wb")
        self.proc = subprocess.Popen(
            ["etcd", "--name=chaos", f"--data-dir={run_dir / 'etcd'}",
             f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
             f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
             f"--initial-cluster=chaos={peer_url}", "--log-level=warn"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=2) as r:
                    if b'"health":"true"' in r.read():
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise HarnessError(f"etcd exited at start ({self.proc.returncode}); see etcd.log")
            if time.monotonic() > deadline:
                raise HarnessError("etcd did not become healthy")
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def help_text(*args):
    out = subprocess.run([str(BIN), *args, "--help"], capture_output=True, text=True, timeout=30)
    return out.stdout + out.stderr


# ----------------------------------------------------------------- clients

class RedisKind:
    """redis-py's RedisCluster: it finds the servers from any one and
    follows -MOVED. Retries are off: a command that failed on a connection
    may still have been applied, and sent again it could take effect
    twice; each failure is recorded instead, as of unknown outcome. (A
    -MOVED is followed still: it means the server did nothing.)"""

    name = "redis"

    def __init__(self, h):
        from redis.backoff import NoBackoff
        from redis.cluster import ClusterNode, RedisCluster
        from redis.retry import Retry
        nodes = [ClusterNode(host, resp) for host, _, resp in h.server_addrs]
        self.rc = RedisCluster(startup_nodes=nodes, password=h.secret,
                               socket_timeout=OP_TIMEOUT_S, socket_connect_timeout=OP_TIMEOUT_S,
                               retry=Retry(NoBackoff(), 0), require_full_coverage=False)

    def put(self, key, value):
        if self.rc.set(key, value) is not True:
            raise RuntimeError("SET did not answer OK")

    def get(self, key):
        v = self.rc.get(key)
        return None if v is None else v.decode()

    def close(self):
        self.rc.close()


class NativeKind:
    """`fabrickv.Cluster` joined through etcd: it routes by the slot map
    and re-sends only what a server refused (WRONG_SERVER, not applied)."""

    name = "native"

    def __init__(self, h):
        import fabrickv
        self.c = fabrickv.Cluster(registry=h.registry, name=h.cluster, timeout=OP_TIMEOUT_S)

    def put(self, key, value):
        self.c.put(key.encode(), value.encode())

    def get(self, key):
        v = self.c.get(key.encode())
        return None if v is None else v.decode()

    def close(self):
        self.c.close()


def describe(e):
    return f"{type(e).__name__}: {e}"[:200]


def record(out, client, op, key, value, call, ret, known, via, error=None):
    rec = {"client": client, "op": op, "key": key, "value": value, "call": call,
           "return": ret if known else None, "known": known, "via": via}
    if error:
        rec["error"] = error
    out.write(json.dumps(rec) + "\n")


class Client(threading.Thread):
    """One client: random gets and puts of unique values on the keys, each
    recorded to its own history file, until told to stop."""

    def __init__(self, cid, kind, h):
        super().__init__(name=f"client-{cid}", daemon=True)
        self.cid, self.kind, self.h = cid, kind, h
        self.path = h.run_dir / "history" / f"client-{cid}.jsonl"
        self.ops = 0
        self.errors = 0

    def run(self):
        rng = random.Random(f"{self.h.seed}-client-{self.cid}")
        conn, failures, seq = None, 0, 0
        interval = 1.0 / self.h.rate if self.h.rate > 0 else 0.0
        next_at = time.monotonic()
        with open(self.path, "w") as out:
            while not self.h.stop_clients.is_set():
                if conn is None:
                    try:
                        conn = self.kind(self.h)
                    except Exception:  # a server down or cut off: try again soon
                        self.h.stop_clients.wait(rng.uniform(0.05, 0.2))
                        continue
                if interval:
                    next_at = max(next_at + interval, time.monotonic() - interval)
                    delay = next_at - time.monotonic()
                    if delay > 0 and self.h.stop_clients.wait(delay):
                        break
                key = rng.choice(self.h.current_keys())
                op = "put" if rng.random() < WRITE_SHARE else "get"
                value = f"c{self.cid}-{seq}" if op == "put" else None
                seq += op == "put"
                call = now_ns()
                try:
                    if op == "put":
                        conn.put(key, value)
                    else:
                        value = conn.get(key)
                    ret, known, err = now_ns(), True, None
                    failures = 0
                except Exception as e:
                    ret, known, err = now_ns(), False, describe(e)
                    failures += 1
                    self.errors += 1
                record(out, self.cid, op, key, value, call, ret, known, conn.name, err)
                self.ops += 1
                if not known:
                    # Pace a failing client (a refused connection fails at
                    # once); after many failures in a row start afresh.
                    if failures >= 10:
                        conn.close()
                        conn, failures = None, 0
                    self.h.stop_clients.wait(rng.uniform(0.01, 0.05))
        if conn is not None:
            conn.close()


class Pusher(threading.Thread):
    """The table client: through `fabrickv.Cluster` (which sends a push
    again under its request id after a failover), pushes a gradient of -1
    to one row at a time of an SGD table with rate 1, so each push applied
    adds 1 to the row. Counts, per row, the pushes acknowledged and those
    of unknown outcome."""

    def __init__(self, h):
        super().__init__(name="pusher", daemon=True)
        self.h = h
        self.acked = [0] * TABLE_ROWS
        self.unknown = [0] * TABLE_ROWS
        self.ops = 0
        self.errors = 0
        self.unsupported = None

    def run(self):
        import fabrickv
        import numpy as np
        rng = random.Random(f"{self.h.seed}-pusher")
        grad = np.full((1, TABLE_DIM), -1.0, np.float32)
        interval = 1.0 / self.h.rate if self.h.rate > 0 else 0.0
        c = t = None
        while not self.h.stop_clients.is_set():
            if t is None:
                try:
                    c = fabrickv.Cluster(registry=self.h.registry, name=self.h.cluster,
                                         timeout=OP_TIMEOUT_S)
                    t = c.create_table(TABLE, dim=TABLE_DIM, optimizer="sgd", lr=1.0)
                except Exception as e:
                    if "not served" in str(e):
                        self.unsupported = describe(e)
                        return
                    if c is not None:
                        c.close()
                    c = t = None
                    self.h.stop_clients.wait(rng.uniform(0.05, 0.2))
                    continue
            row = rng.randrange(TABLE_ROWS)
            try:
                t.push(np.array([row], np.uint64), grad)
                self.acked[row] += 1
            except Exception:
                self.unknown[row] += 1
                self.errors += 1
                self.h.stop_clients.wait(rng.uniform(0.01, 0.05))
            self.ops += 1
            if interval:
                self.h.stop_clients.wait(interval)
        if c is not None:
            c.close()

    def check(self, timeout):
        """Reads every row (a fresh client, until it can); returns the rows
        outside their bounds as (row, count, acked, unknown), or None and
        why the rows could not be read."""
        import fabrickv
        import numpy as np
        deadline = time.monotonic() + timeout
        while True:
            try:
                c = fabrickv.Cluster(registry=self.h.registry, name=self.h.cluster,
                                     timeout=OP_TIMEOUT_S)
                try:
                    values = c.table(TABLE).pull(np.arange(TABLE_ROWS, dtype=np.uint64))
                finally:
                    c.close()
                break
            except Exception as e:
                if time.monotonic() > deadline:
                    return None, describe(e)
                time.sleep(0.2)
        return rows_out_of_bounds([float(v[0]) for v in values], self.acked, self.unknown), None


def rows_out_of_bounds(values, acked, unknown):
    """The rows whose value is not a count between the pushes acknowledged
    and those plus the ones of unknown outcome, as (row, value, acked,
    unknown)."""
    bad = []
    for row, x in enumerate(values):
        count = round(x)
        if abs(x - count) > COUNT_TOLERANCE or not acked[row] <= count <= acked[row] + unknown[row]:
            bad.append((row, x, acked[row], unknown[row]))
    return bad


# --------------------------------------------------------------- the run

class Harness:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.rng = random.Random(f"{args.seed}-faults")
        self.rate = args.rate
        self.run_dir = Path(tempfile.mkdtemp(prefix="fabrickv-chaos-"))
        (self.run_dir / "history").mkdir()
        self.cluster = f"chaos-{os.getpid()}"
        # The clients move to a fresh set of keys every --generation
        # seconds. Checking one key's history costs porcupine memory that
        # grows with the square of its length, so an hour on the same 16
        # keys would not fit; a generation's keys stay few (operations
        # conflict as much) and short-lived, while every generation's keys
        # are read at the end, so older data must survive the later faults.
        count = max(1, math.ceil(args.seconds / args.generation))
        self.generations = [pick_keys(args.keys, args.servers, f"chaos:{g}:") for g in range(count)]
        self.keys = [k for gen in self.generations for k in gen]
        self.t_workload = None
        self.stop_clients = threading.Event()
        self.stop_faults = threading.Event()
        self.stop_all = threading.Event()
        self.lock = threading.Lock()
        self.net = None
        self.etcd = None
        self.servers = []
        self.controller = None
        self.stress = None
        self.threads = []
        self.faults = []          # (kind, server, start ns, end ns, description)
        self.maps = []            # (ns, epoch, primaries) whenever the map changed
        self.unexpected = []      # (name, exit code) of exits nobody caused
        self.thread_errors = []
        self.failed = True        # until a verdict says otherwise: keeps the run directory
        self.t0 = now_ns()
        # The cluster secret: servers listen beyond loopback in namespaces.
        # In a 0600 file, named to every process in its environment.
        self.secret = secrets.token_hex(32)
        self.secret_file = self.run_dir / "secret"
        fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.secret)
        self.env = {k: v for k, v in os.environ.items() if k != "FABRICKV_AUTH_TOKEN"}
        self.env["FABRICKV_AUTH_TOKEN_FILE"] = str(self.secret_file)

    # -- setup

    def detect(self):
        """Which replication the binary has: `serve --replicas` and the
        `cluster controller` subcommand."""
        if not BIN.exists():
            raise HarnessError(f"{BIN} is missing: run `make build`")
        has_replicas = "--replicas" in help_text("serve")
        has_controller = re.search(r"^\s+controller\b", help_text("cluster"), re.M) is not None
        a = self.args
        if a.replicas == "auto":
            self.replicas = 2 if has_replicas and has_controller else 1
            if self.replicas == 1:
                log("replication not available in this binary (no serve --replicas or no cluster "
                    "controller): one copy of each slot, so a kill loses that server's keys")
        else:
            self.replicas = int(a.replicas)
            if self.replicas < 1:
                raise HarnessError("--replicas must be at least 1")
            if self.replicas > 1 and not has_replicas:
                raise HarnessError("this binary's `serve` has no --replicas")
            if self.replicas > a.servers:
                raise HarnessError("--replicas cannot exceed --servers")
        self.pass_replicas = has_replicas
        self.controller_template = None
        if a.controller != "none" and self.replicas >= 2:
            if a.controller == "auto":
                if not has_controller:
                    raise HarnessError("replicas need the failover controller, and this binary "
                                       "has no `cluster controller` (give --controller CMD)")
                template = "{bin} cluster controller --registry {registry} --cluster {cluster}"
                # Its heartbeat address must be one the servers reach:
                # in namespaces, not the root namespace's loopback.
                if "--listen" in help_text("cluster", "controller"):
                    template += " --listen {host}:0"
            else:
                template = a.controller
            self.controller_template = template

    def build_checker(self):
        go = shutil.which("go") or "/usr/local/go/bin/go"
        out = subprocess.run([go, "build", "-o", str(self.run_dir / "linearizability"), "."],
                             cwd=CHECKER_SRC, capture_output=True, text=True)
        if out.returncode != 0:
            raise HarnessError(f"building the checker failed (`make deps` fetches porcupine):\n{out.stderr}")

    def start(self):
        a = self.args
        # With resizes, one more server than the cluster starts with: it
        # registers and waits to be added.
        total = a.servers + (1 if "resize" in a.faults else 0)
        self.net = Namespaces(total) if a.net == "netns" else Loopback(total)
        self.server_addrs = [self.net.server(i) for i in range(total)]
        self.etcd = Etcd(self.net.etcd_host, self.run_dir)
        self.registry = self.etcd.url
        for i in range(total):
            host, native, resp = self.server_addrs[i]
            argv = [str(BIN), "serve", "--listen", f"tcp://{host}:{native}", "--resp", f"{host}:{resp}",
                    "--grpc", "off", "--registry", self.registry, "--cluster", self.cluster,
                    "--id", str(i), "--cluster-size", str(a.servers),
                    "--workers", "1", "--memory", "64MB", "--log-level", "info", *PS_POOL_ARGS]
            if self.pass_replicas:
                argv += ["--replicas", str(self.replicas)]
            self.servers.append(Proc(f"server {i}", self.net.wrap(i, argv), self.env,
                                     self.run_dir / f"server-{i}.log", banner=b"serving on"))
        for s in self.servers:
            s.start()
        for s in self.servers:
            if not s.wait_ready(START_TIMEOUT_S):
                raise HarnessError(f"{s.name} did not start:\n{s.log_tail()}")
        if self.controller_template:
            cmd = self.controller_template.format(bin=BIN, registry=self.registry, cluster=self.cluster,
                                                  host=self.net.etcd_host)
            self.controller = Proc("controller", shlex.split(cmd), self.env, self.run_dir / "controller.log")
            self.controller.start()
        # The first map may change a few times before the cluster is whole
        # (with replicas, backups join and catch up): the epoch counted
        # from is the settled map's.
        deadline = time.monotonic() + START_TIMEOUT_S
        settled, said = self.map_settled()
        while not settled:
            if time.monotonic() > deadline:
                raise HarnessError(f"the cluster did not come up; {said}")
            time.sleep(0.2)
            settled, said = self.map_settled()
        self.maps = self.maps[-1:]
        if a.stress:
            if shutil.which("stress-ng") is None:
                raise HarnessError("stress-ng is missing: run `make deps`")
            self.stress = subprocess.Popen(["stress-ng", "--cpu", "2", "--quiet"], stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True)

    def show(self, wait=0):
        try:
            return subprocess.run([str(BIN), "cluster", "show", "--registry", self.registry,
                                   "--cluster", self.cluster, "--wait", str(wait)],
                                  env=self.env, capture_output=True, text=True, timeout=wait + 20)
        except subprocess.TimeoutExpired:
            return None

    def current_keys(self):
        """The keys of the generation the workload is in."""
        g = int((time.monotonic() - self.t_workload) // self.args.generation)
        return self.generations[min(g, len(self.generations) - 1)]

    def map_settled(self):
        """Whether the cluster is whole: `cluster show` exits 0 (every
        server registered) and lists no server still joining (catching up
        before it becomes a backup). Returns (settled, what it said)."""
        out = self.show()
        if out is None:
            return False, "`cluster show` timed out"
        self.note_epoch(out.stdout)
        # With several copies, every group must hold all of them in sync
        # (a server back from a fault is a backup again, not just up).
        want = self.replicas - 1
        backups = re.findall(r"backups \[([0-9,]*)\]", out.stdout)
        whole = all(len([b for b in g.split(",") if b]) == want for g in backups)
        settled = out.returncode == 0 and "joining" not in out.stdout and whole
        return settled, f"`cluster show` says:\n{out.stdout}{out.stderr}"

    def note_epoch(self, text):
        """Notes the map `cluster show` printed when it changed: its epoch
        (bumped by every change, failovers and bookkeeping alike) and each
        slot run's primary (which only a failover moves)."""
        m = re.search(r"slot map: epoch (\d+)", text)
        if m:
            epoch = int(m.group(1))
            primaries = tuple((int(a), int(b), int(p)) for a, b, p in
                              re.findall(r"slots (\d+)-(\d+)\s+primary\s+(\d+)", text))
            if not self.maps or self.maps[-1][1] != epoch:
                self.maps.append((now_ns(), epoch, primaries))

    def primary_moves(self):
        """How many of the observed map changes gave some slot another
        primary."""
        def owner(primaries):
            own = [None] * REDIS_SLOTS
            for first, last, p in primaries:
                own[first:last + 1] = [p] * (last + 1 - first)
            return own
        owners = [owner(p) for _, _, p in self.maps]
        return sum(1 for a, b in zip(owners, owners[1:]) if a != b)

    # -- background threads

    def spawn(self, target, name):
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def supervise(self):
        """Restarts whatever exited (a deposed server, a crash, a kill
        fault's victim once the fault releases it), and notes exits no
        fault caused."""
        procs = self.servers + ([self.controller] if self.controller else [])
        while not self.stop_all.wait(0.1):
            with self.lock:
                for p in procs:
                    if p.proc is None or p.proc.poll() is None:
                        continue
                    code = p.proc.returncode
                    if len(p.exits) < p.starts:       # an exit not yet seen
                        p.exits.append(code)
                        if not p.hold:                # not a kill fault's
                            self.unexpected.append((p.name, code))
                            # One that exits again soon after its start
                            # waits longer each time (up to 10 s).
                            quick = time.monotonic() - p.started_at < 5.0
                            p.backoff = min(p.backoff * 2, 10.0) if quick else 0.5
                            p.restart_at = time.monotonic() + p.backoff
                            log(f"{p.name} exited with {code}; restarting in {p.backoff:g} s")
                    if not p.hold and time.monotonic() >= p.restart_at:
                        p.start()

    def watch_epochs(self):
        """The slot map's epoch, about once a second (every change of the
        map bumps it: a failover, a rejoin)."""
        while not self.stop_all.wait(1.0):
            out = self.show()
            if out is not None:
                self.note_epoch(out.stdout)

    def inject(self):
        """One fault at a time, at random gaps, on a random server that is
        serving; each healed before the next (and at once when the run
        ends). Its span goes into the history, drawn beside the operations
        in the checker's visualization."""
        kinds = self.args.faults
        while not self.stop_faults.wait(self.rng.uniform(*FAULT_GAP_S)):
            # A fault the cluster is built to survive: one at a time, on a
            # whole cluster (every group back to all its copies in sync).
            # Two overlapping faults on one group of two copies lose what
            # only those two held, by design.
            if not self.map_settled()[0]:
                continue
            kind = self.rng.choice(kinds)
            i = self.rng.randrange(len(self.servers))
            s = self.servers[i]
            if not s.ready():
                continue  # still restarting after an earlier fault
            start = now_ns()
            if kind == "kill":
                with self.lock:
                    s.hold = True
                    s.kill()
                self.stop_faults.wait(self.rng.uniform(*KILL_DOWN_S))
                with self.lock:
                    s.hold = False
                    s.restart_at = 0.0
                down = (now_ns() - start) / 1e9
                # The fault lasts until the server serves again.
                s.wait_ready(START_TIMEOUT_S, self.stop_all)
                desc = f"kill -9 server {i}, restarted after {down:.1f} s"
            elif kind == "stop":
                with self.lock:
                    s.signal(signal.SIGSTOP)
                try:
                    self.stop_faults.wait(self.rng.uniform(*STOP_S))
                finally:
                    with self.lock:
                        s.signal(signal.SIGCONT)
                desc = f"SIGSTOP server {i} for {(now_ns() - start) / 1e9:.1f} s"
            elif kind == "resize":
                desc = self.resize()
            else:
                self.net.isolate(i)
                try:
                    self.stop_faults.wait(self.rng.uniform(*ISOLATE_S))
                finally:
                    self.net.heal(i)
                desc = f"isolate server {i} for {(now_ns() - start) / 1e9:.1f} s"
            self.faults.append((kind, i, start, now_ns(), desc))
            log(f"+{(start - self.t0) / 1e9:6.1f} s  {desc}")

    def members(self):
        """The ids `cluster show` says are up, and those of them holding
        slots (leading or backing some up)."""
        out = self.show()
        if out is None or out.returncode != 0:
            return None
        up, held = set(), set()
        for line in out.stdout.splitlines():
            m = re.match(r"\s+(\d+)\s+up\s.*leads (\d+) slots, backs up (\d+)", line)
            if m:
                up.add(int(m.group(1)))
                if int(m.group(2)) or int(m.group(3)):
                    held.add(int(m.group(1)))
        return up, held

    def resize(self):
        """Adds the server holding no slots, or (when every server holds
        some) removes a random member, by the CLI a user runs; the command
        waits until the slots have moved. Returns the fault's text."""
        seen = self.members()
        if seen is None:
            return "resize skipped: the map could not be read"
        up, held = seen
        # The spare registered and serving, past the map's size at first.
        idle = [i for i in range(len(self.servers))
                if i not in held and (i in up or i >= self.args.servers) and self.servers[i].ready()]
        start = now_ns()
        if idle:
            i = self.rng.choice(idle)
            argv = ["add", "--id", str(i)]
            what = f"add server {i}"
        elif len(held) > self.replicas:
            i = self.rng.choice(sorted(held))
            argv = ["remove", "--id", str(i)]
            what = f"remove server {i}"
        else:
            return "resize skipped: too few servers to remove one"
        out = subprocess.run([str(BIN), "cluster", *argv, "--registry", self.registry,
                              "--cluster", self.cluster, "--wait", str(RESIZE_TIMEOUT_S)],
                             env=self.env, capture_output=True, text=True,
                             timeout=RESIZE_TIMEOUT_S + 30)
        if out.returncode != 0:
            raise HarnessError(f"`fabrickv cluster {' '.join(argv)}` failed:\n{out.stdout}{out.stderr}")
        return f"{what}, slots moved in {(now_ns() - start) / 1e9:.1f} s"

    # -- the end

    def heal_all(self):
        with self.lock:
            for s in self.servers:
                s.signal(signal.SIGCONT)
                s.hold = False
                s.restart_at = 0.0
        if isinstance(self.net, Namespaces):
            for i in range(len(self.servers)):
                self.net.heal(i)

    def settle(self):
        """Waits for every server to serve and the map to be whole again.
        Returns None, or what was still wrong at the deadline."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            down = [s.name for s in self.servers if not s.ready()]
            if down:
                why = f"not serving: {', '.join(down)}"
            else:
                settled, why = self.map_settled()
                if settled:
                    return None
            if time.monotonic() > deadline:
                return why
            time.sleep(0.2)

    def final_reads(self, out, timeout):
        """Reads every key through both kinds of client (fresh ones), round
        after round until one round reads them all, every attempt into the
        history. Returns ({key: [(ret ns, value)]}, None), or (None, what
        failed) after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        n = self.args.clients
        conns = {}
        try:
            for cid, kind in ((n, RedisKind), (n + 1, NativeKind)):
                while cid not in conns:
                    try:
                        conns[cid] = kind(self)
                    except Exception as e:
                        if time.monotonic() > deadline:
                            return None, f"the final {kind.name} client cannot connect: {describe(e)}"
                        time.sleep(0.2)
            while True:
                failures = []
                finals = {k: [] for k in self.keys}
                for key in self.keys:
                    for cid, conn in conns.items():
                        call = now_ns()
                        try:
                            value = conn.get(key)
                        except Exception as e:
                            record(out, cid, "get", key, None, call, now_ns(), False,
                                   f"{conn.name} (final)", describe(e))
                            failures.append(f"{conn.name} get {key}: {describe(e)}")
                            continue
                        ret = now_ns()
                        record(out, cid, "get", key, value, call, ret, True, f"{conn.name} (final)")
                        finals[key].append((ret, value))
                if not failures:
                    return finals, None
                if time.monotonic() > deadline:
                    return None, "reads still fail: " + "; ".join(failures[:4])
                time.sleep(0.2)
        finally:
            for conn in conns.values():
                conn.close()

    def teardown(self):
        self.stop_clients.set()
        self.stop_faults.set()
        self.stop_all.set()
        for t in self.threads:
            t.join(timeout=OP_TIMEOUT_S * 10)
        if self.stress is not None:
            self.stress.kill()
            self.stress.wait()
        with self.lock:
            for p in self.servers + ([self.controller] if self.controller else []):
                p.kill()
        if self.etcd is not None:
            self.etcd.stop()
        if self.net is not None:
            self.net.close()


def puts_in(history_files):
    """Every put record of the history files, streamed (an hour's run
    holds millions)."""
    for path in history_files:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["op"] == "put":
                    yield r


def lost_writes(history_files, finals):
    """Acknowledged writes that the final state lost.

    Values are unique, so the final value of a key (its last final read)
    names the one write w that produced it. An acknowledged write a is
    lost when:
      - the key reads as absent at the end: nothing deletes, so every
        acknowledged write of the key is lost;
      - or a was invoked after w had completed: real time then orders a
        after w, so a must have overwritten w's value, yet w's value is
        what remains.
    An acknowledged write that overlapped w may be ordered before it, and
    a w of unknown outcome may have taken effect at any time after its
    call: neither counts (sound: nothing is reported that a correct store
    could do). A final value that no put wrote is reported as corrupt.
    The linearizability check covers the rest (stale or reordered reads
    during the run).

    Two passes over the history, keeping only a few numbers per key.
    Returns (lost: [(key, value, ack ns)], corrupt: [(key, value)])."""
    final = {k: max(reads, key=lambda r: r[0])[1] for k, reads in finals.items()}
    # Pass 1: the write of each key's final value (its return time; None
    # when its outcome is unknown: it bounds nothing).
    w_ret = {}
    for r in puts_in(history_files):
        if final.get(r["key"]) == r["value"]:
            w_ret[r["key"]] = r["return"] if r["known"] else None
    corrupt = [(k, v) for k, v in final.items() if v is not None and k not in w_ret]
    # Pass 2: the acknowledged writes that had to come after it.
    lost = []
    for r in puts_in(history_files):
        k = r["key"]
        if not r["known"] or k not in final:
            continue
        if final[k] is None or (w_ret.get(k) is not None and r["call"] > w_ret[k]):
            lost.append((k, r["value"], r["return"]))
    return lost, corrupt


def run_checker(h, history, timeout_s):
    out = subprocess.run([str(h.run_dir / "linearizability"), "-history", str(history),
                          "-timeout", f"{timeout_s}s", "-html", str(h.run_dir / "violation.html"), "-json"],
                         capture_output=True, text=True)
    if out.returncode not in (0, 1, 3):
        raise HarnessError(f"the checker failed ({out.returncode}): {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=float(os.environ.get("CHAOS_SECONDS", 60)),
                   help="how long the clients run under faults (default: $CHAOS_SECONDS, else 60)")
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--replicas", default="auto",
                   help="copies of each slot; auto: 2 when the binary replicates, else 1")
    p.add_argument("--controller", default="auto",
                   help="the failover controller's command ({bin}, {registry}, {cluster} and {host}, "
                        "the address the servers reach this host at, filled in), "
                        "started when replicas >= 2; auto: `fabrickv cluster controller`; none: no controller")
    p.add_argument("--faults", default="kill,stop,isolate,resize",
                   help="comma-separated kinds among kill, stop, isolate, resize; none for a run without faults")
    p.add_argument("--seed", type=int, default=None, help="seeds the fault schedule and the clients' choices")
    p.add_argument("--stress", action="store_true",
                   help="run stress-ng --cpu 2 alongside (a loaded machine must not fail over by itself)")
    p.add_argument("--keep", action="store_true", help="keep the run directory even when the run passes")
    p.add_argument("--clients", type=int, default=6, help="client threads, half of each kind")
    p.add_argument("--keys", type=int, default=16, help="keys the clients share at a time")
    p.add_argument("--generation", type=float, default=60.0,
                   help="seconds before the clients move to fresh keys (the checker's memory "
                        "grows with the square of one key's history)")
    p.add_argument("--rate", type=float, default=200.0,
                   help="operations a second per client, at most (0: as fast as it can)")
    p.add_argument("--net", choices=("auto", "netns", "loopback"), default="auto",
                   help="servers in network namespaces (needed to isolate) or on loopback; "
                        "auto: namespaces when running as root")
    a = p.parse_args(argv)
    a.faults = [] if a.faults == "none" else a.faults.split(",")
    for f in a.faults:
        if f not in FAULT_KINDS:
            p.error(f"unknown fault {f!r} (kinds: {', '.join(FAULT_KINDS)}, or none)")
    if a.net == "auto":
        a.net = "netns" if os.geteuid() == 0 and shutil.which("ip") else "loopback"
    if "isolate" in a.faults and a.net != "netns":
        p.error("isolate needs --net netns (root and iproute2)")
    if a.clients < 2 or a.servers < 1 or a.keys < 1 or a.generation < 1:
        p.error("at least 2 clients, 1 server, 1 key and a 1-second generation")
    if a.seed is None:
        a.seed = random.randrange(1 << 31)
    return a


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv):
    a = parse_args(argv)
    # SIGINT too: a shell starts a background job with SIGINT ignored, and
    # Python then leaves it so; either signal must tear the run down.
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    h = Harness(a)
    # An exception in any thread (a fault that could not be applied or
    # healed, a client's bookkeeping) makes the run a harness failure.
    threading.excepthook = lambda e: (h.thread_errors.append(f"{e.thread.name}: {describe(e.exc_value)}"),
                                      log(f"thread {e.thread.name} failed: {describe(e.exc_value)}"),
                                      h.stop_faults.set())
    try:
        return run(h)
    except HarnessError as e:
        log(f"harness failure: {e}")
        return 2
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    finally:
        h.teardown()
        if a.keep or h.failed:
            log(f"run directory: {h.run_dir} (kept)")
        else:
            shutil.rmtree(h.run_dir, ignore_errors=True)
            log(f"run directory {h.run_dir} removed (--keep keeps it)")


def run(h):
    a = h.args
    h.detect()
    h.build_checker()
    try:
        import fabrickv
        import redis  # noqa: F401
    except ImportError as e:
        raise HarnessError(f"{e}: run with the project's venv after `make python`")
    fabrickv.set_auth_token_file(str(h.secret_file))
    log(f"{a.seconds:g} s, {a.servers} servers, {h.replicas} "
        f"{'copy' if h.replicas == 1 else 'copies'} of each slot, faults: {','.join(a.faults) or 'none'}, "
        f"seed {a.seed}, {a.clients} clients on {a.keys} keys at a time "
        f"({len(h.generations)} generation{'s' if len(h.generations) > 1 else ''}), {a.net}"
        f"{', stress-ng' if a.stress else ''}; run directory {h.run_dir}")
    h.start()
    clients = [Client(cid, RedisKind if cid % 2 == 0 else NativeKind, h) for cid in range(a.clients)]
    pusher = Pusher(h)
    h.spawn(h.supervise, "supervisor")
    h.spawn(h.watch_epochs, "epochs")
    h.t_workload = time.monotonic()
    for c in clients:
        c.start()
    pusher.start()
    if a.faults:
        h.spawn(h.inject, "faults")
    time.sleep(a.seconds)
    h.stop_faults.set()
    h.stop_clients.set()
    for c in clients:
        c.join()
    pusher.join()
    for t in h.threads:
        if t.name == "faults":
            t.join()
    h.heal_all()
    if h.thread_errors:
        raise HarnessError("; ".join(h.thread_errors))
    log("workload done; healed, waiting for the cluster to settle")
    t_settle = time.monotonic()
    unsettled = h.settle()
    if unsettled is None:
        log(f"settled in {time.monotonic() - t_settle:.1f} s; reading every key")
    else:
        log(f"the cluster did not settle within {SETTLE_TIMEOUT_S:g} s; {unsettled.strip()}")
    end_path = h.run_dir / "history" / "final.jsonl"
    with open(end_path, "w") as out:
        # Keys may be served even by a cluster that is not whole (another
        # server leads them): read them anyway, for the lost-write check.
        finals, unread = h.final_reads(out, SETTLE_TIMEOUT_S if unsettled is None else 30.0)
        for kind, i, start, end, desc in h.faults:
            out.write(json.dumps({"op": "fault", "desc": desc, "call": start, "return": end}) + "\n")
    files = sorted((h.run_dir / "history").glob("client-*.jsonl")) + [end_path]
    history = h.run_dir / "history.jsonl"
    with open(history, "wb") as merged:
        for path in files:
            with open(path, "rb") as f:
                shutil.copyfileobj(f, merged)
    if finals is None:
        log(f"the final reads failed: {unread}")
        lost, corrupt = [], []
    else:
        lost, corrupt = lost_writes(files, finals)
    if pusher.unsupported:
        rows = (None, f"this binary serves no tables over etcd ({pusher.unsupported})")
    else:
        rows = pusher.check(SETTLE_TIMEOUT_S if unsettled is None else 30.0)
    log("checking linearizability")
    verdict = run_checker(h, history, max(300, int(a.seconds)))
    h.failed = summarize(h, clients, verdict, lost, corrupt, settled=unsettled is None,
                         read=finals is not None, pusher=pusher, rows=rows)
    return 1 if h.failed else 0


def summarize(h, clients, verdict, lost, corrupt, settled, read, pusher, rows):
    """Prints the run's summary; returns whether it failed."""
    a = h.args
    kinds = {k: sum(1 for f in h.faults if f[0] == k) for k in FAULT_KINDS}
    exits = {}
    for name, code in h.unexpected:
        exits[code] = exits.get(code, 0) + 1
    crashes = [(n, c) for n, c in h.unexpected if c != EXIT_DEPOSED]
    epochs = [e for _, e, _ in h.maps]
    moves = h.primary_moves()
    ops = sum(c.ops for c in clients)
    errors = sum(c.errors for c in clients)
    print()
    print(f"== FabricKV chaos: {a.seconds:g} s, {a.servers} servers, {h.replicas} "
          f"{'copy' if h.replicas == 1 else 'copies'}, seed {a.seed}")
    print(f"faults injected: kill {kinds['kill']}, stop {kinds['stop']}, isolate {kinds['isolate']}, "
          f"resize {kinds['resize']}")
    print(f"server exits no fault caused: {len(h.unexpected)}"
          + (f" ({', '.join(f'{n} with code {c}' for c, n in sorted(exits.items()))}; "
             f"{EXIT_DEPOSED} = deposed)" if exits else ""))
    print(f"operations: {ops} by the clients ({errors} of unknown outcome), "
          f"{verdict['records']} recorded with the final reads, {verdict['checked']} checked "
          f"({verdict['pending_dropped']} of unknown outcome left out as unobserved, "
          f"{verdict['pending_kept']} kept open)")
    if epochs:
        print(f"slot map epochs observed: {' -> '.join(map(str, epochs))} ({len(epochs) - 1} changes, "
              f"{moves} of them moving a primary)")
    else:
        print("slot map epochs observed: none (the map could not be read)")
    if verdict["result"] == "linearizable":
        print("linearizability: linearizable, 0 violations")
    elif verdict["result"] == "violation":
        bad = verdict["violations"]
        print(f"linearizability: {len(bad)} of {verdict['keys']} keys NOT linearizable: {', '.join(bad[:10])}"
              + (f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""))
        if verdict.get("visualization"):
            print(f"  visualization: {verdict['visualization']}")
    else:
        print(f"linearizability: UNDECIDED, the check timed out on {', '.join(verdict['undecided'])}")
    if not read:
        print("lost writes: not checked, the final reads failed")
    else:
        print(f"lost writes: {len(lost)} acknowledged writes lost"
              + (f" on {len({k for k, _, _ in lost})} keys" if lost else ""))
    for key, value, ack in sorted(lost, key=lambda x: x[2])[:5]:
        print(f"  {key}: {value} acknowledged at +{(ack - h.t0) / 1e9:.2f} s")
    for key, value in corrupt:
        print(f"  {key}: final value {value!r} was never written")
    bad_rows, unread_rows = rows
    print(f"table pushes: {sum(pusher.acked)} acknowledged, {sum(pusher.unknown)} of unknown outcome "
          f"on {TABLE_ROWS} rows; "
          + ("rows not checked: " + unread_rows if bad_rows is None
             else f"{len(bad_rows)} rows outside [acknowledged, acknowledged + unknown]"))
    for row, x, acked, unknown in (bad_rows or [])[:5]:
        print(f"  row {row}: holds {x:.3f}, {acked} pushes acknowledged, {unknown} of unknown outcome")
    failed = []
    if not settled:
        failed.append(f"the healed cluster was not whole within {SETTLE_TIMEOUT_S:g} s")
    if not read:
        failed.append("some key could not be read at the end (lost writes not checked)")
    if verdict["result"] != "linearizable":
        failed.append("linearizability")
    if lost or corrupt:
        failed.append("lost writes")
    if bad_rows:
        failed.append("table pushes lost or applied twice")
    if bad_rows is None and not pusher.unsupported:
        failed.append("the table's rows could not be read at the end")
    if crashes:
        failed.append(f"{len(crashes)} server crashes (see the server logs)")
    if not a.faults and moves:
        failed.append("a primary moved with no fault injected (a false failover)")
    print(f"RESULT: {'FAIL (' + '; '.join(failed) + ')' if failed else 'PASS'}")
    return bool(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

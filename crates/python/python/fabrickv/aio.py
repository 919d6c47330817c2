"""asyncio forms of the clients: `AsyncClient`, `AsyncCacheClient`,
`AsyncCluster`, `AsyncClusterCache` and their tables.

How a call runs. Each async client owns a fixed pool of `workers` threads,
and each thread its own blocking client (its own connections, and for the
cache its own receive buffer), made on that thread's first call. An
awaited call is put on the pool's queue, where a waiting worker takes it;
the worker runs the blocking call, which releases the GIL while it waits
on the server, and appends the outcome to the pool's list of finished
calls. Only the first outcome of a burst writes to the event loop's
self-pipe (`call_soon_threadsafe`); the loop then completes every future
whose outcome arrived, so with 16 calls in flight one wake-up of the loop
serves many. No thread is made per call, and the event loop never blocks:
many calls in flight from one `asyncio.gather` spread over the workers'
connections, so they run in parallel on the servers instead of taking
turns on one connection.

Why not an async Rust runtime: the Rust clients are blocking state
machines that own their connections (`&mut`), so a runtime would still
park each call on a blocking thread; a pool whose every thread owns a
connection gets the parallelism without a lock between calls.

Cancellation. A call cancelled before its worker took it never runs. One
cancelled while it runs finishes on its worker (a request half sent or a
reply half read would leave the connection out of step), and the
cancelled `await` returns only once it has: after `CancelledError` is
raised, nothing writes the caller's `out=` any more, and the connection
serves the next call as if nothing happened.

Arguments and results are those of the blocking classes (same names, same
keywords, same errors), awaited.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Literal, Sequence, TypeVar, overload

import numpy as np
import numpy.typing as npt

from ._native import CacheClient, Client, Cluster, ClusterCache, ClusterTable, Error, Table

__all__ = [
    "AsyncCacheClient",
    "AsyncClient",
    "AsyncCluster",
    "AsyncClusterCache",
    "AsyncClusterTable",
    "AsyncTable",
]

C = TypeVar("C", Client, CacheClient, Cluster, ClusterCache)
T = TypeVar("T")

# Workers of a kv/table client by default: enough to keep a server's
# workers busy from one event loop without a crowd of idle connections.
DEFAULT_WORKERS = 4

# Workers of a cache client by default: each holds a receive buffer of
# `buffer_mb` MiB, so fewer.
DEFAULT_CACHE_WORKERS = 2


def _closed_error() -> Error:
    e = Error("the client is closed")
    e.code = "UNAVAILABLE"
    return e


class _Call:
    """One awaited call on its way through a pool: what to run, the
    future its awaiter waits on, and who claimed it first (a worker to run
    it, or the awaiter's cancellation to drop it)."""

    __slots__ = ("run", "fut", "claim", "delivered", "waiter")

    def __init__(self, run: Callable[[Any], Any], fut: asyncio.Future[Any]) -> None:
        self.run = run
        self.fut = fut
        # Taken (without blocking) by whichever comes first: the worker
        # that runs the call, or a cancelled awaiter that drops it.
        self.claim = threading.Lock()
        # Set on the event loop once the worker's outcome has arrived.
        self.delivered = False
        # What a cancelled awaiter waits on for a call already running.
        self.waiter: asyncio.Future[None] | None = None


# What a worker takes from its queue to stop.
_STOP = object()


def _serve(ref: weakref.ReferenceType[_Workers[Any]], calls: queue.SimpleQueue[Any]) -> None:
    """A worker thread: runs the calls it takes until told to stop, or
    until its pool is gone. It holds its pool only weakly between calls,
    so a pool never closed is still collected (and its threads stopped,
    by the finalizer `_Workers.__init__` registers)."""
    while True:
        item = calls.get()
        if item is _STOP:
            return
        pool = ref()
        if pool is None:
            return
        pool._run_one(item)
        del pool


def _stop_threads(calls: queue.SimpleQueue[Any], n: int) -> None:
    """Tells `n` worker threads to stop once the calls queued are done."""
    for _ in range(n):
        calls.put(_STOP)


class _Workers(Generic[C]):
    """A fixed pool of threads, each with its own blocking client made by
    `make` on the thread's first call, fed from one queue.

    One hand-off each way, and fewer wake-ups than calls: a call is put
    on the queue (`queue.SimpleQueue`, whose `put` wakes one waiting
    worker), and a finished call's outcome is appended to `_done`; the
    worker writes to the event loop's self-pipe (`call_soon_threadsafe`)
    only when no drain of `_done` is pending already, so with many calls
    in flight one wake-up of the loop delivers every outcome that arrived
    meanwhile."""

    def __init__(self, make: Callable[[], C], workers: int, name: str) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, not {workers!r}")
        self._make: Callable[[], C] = make
        self._local = threading.local()
        self._clients: list[C] = []
        self._lock = threading.Lock()
        self._closed = False
        self.size = workers
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Outcomes not yet delivered, and whether a drain is scheduled.
        self._done: collections.deque[tuple[_Call, bool, Any]] = collections.deque()
        self._drain_pending = False
        # The event loop the pool delivers to (the first that awaited a
        # call); a call from another loop is delivered on its own.
        self._loop: asyncio.AbstractEventLoop | None = None
        ref = weakref.ref(self)
        self._threads = [threading.Thread(target=_serve, args=(ref, self._queue),
                                          name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        self._stop: Callable[[], Any] = weakref.finalize(
            self, _stop_threads, self._queue, workers)
        for t in self._threads:
            t.start()

    def _client(self) -> C:
        c: C | None = getattr(self._local, "client", None)
        if c is None:
            c = self._make()
            with self._lock:
                if self._closed:
                    c.close()
                    raise _closed_error()
                self._clients.append(c)
            self._local.client = c
        return c

    def cached(self, key: str, make: Callable[[C], T]) -> T:
        """What `make` returns for this thread's client, made once per
        thread and `key` (a table opened on the thread's client)."""
        made: dict[str, Any] | None = getattr(self._local, "made", None)
        if made is None:
            made = {}
            self._local.made = made
        if key not in made:
            made[key] = make(self._client())
        value: T = made[key]
        return value

    def _run_one(self, item: _Call) -> None:
        """Runs a call taken from the queue (on a worker), unless its
        awaiter was cancelled first."""
        if not item.claim.acquire(blocking=False):
            return  # cancelled before it ran: dropped
        try:
            result = item.run(self._client())
        except BaseException as e:  # delivered to the awaiter
            self._finish(item, False, e)
        else:
            self._finish(item, True, result)

    def _finish(self, item: _Call, ok: bool, value: Any) -> None:
        """Hands a call's outcome to its event loop (on a worker)."""
        loop = item.fut.get_loop()
        try:
            if loop is not self._loop:
                loop.call_soon_threadsafe(self._deliver, item, ok, value)
                return
            self._done.append((item, ok, value))
            if not self._drain_pending:
                self._drain_pending = True
                loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            pass  # the loop is closed: no one awaits the call any more

    def _drain(self) -> None:
        """Delivers every outcome that arrived (on the event loop)."""
        self._drain_pending = False
        done = self._done
        while done:
            self._deliver(*done.popleft())

    @staticmethod
    def _deliver(item: _Call, ok: bool, value: Any) -> None:
        """Completes the call's future, or wakes its cancelled awaiter
        (on the event loop)."""
        item.delivered = True
        fut = item.fut
        if fut.cancelled():
            if item.waiter is not None and not item.waiter.done():
                item.waiter.set_result(None)
        elif ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    async def run(self, call: Callable[[C], T]) -> T:
        """Runs `call` on a worker's client; see the module doc for
        cancellation."""
        if self._closed:
            raise _closed_error()
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        fut: asyncio.Future[T] = loop.create_future()
        item = _Call(call, fut)
        self._queue.put(item)
        try:
            return await fut
        except asyncio.CancelledError:
            if not item.claim.acquire(blocking=False) and not item.delivered:
                # Running: let it finish, so that it writes no caller
                # memory after this await has ended.
                item.waiter = loop.create_future()
                await asyncio.wait([item.waiter])
            raise

    def close(self) -> None:
        """Waits for the calls in flight, then closes every worker's
        client. Closing twice is harmless."""
        with self._lock:
            self._closed = True
        self._stop()  # once: a second close finds it done
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
        with self._lock:
            clients, self._clients = self._clients, []
        for c in clients:
            c.close()

    @property
    def closed(self) -> bool:
        return self._closed


class _AsyncBase(Generic[C]):
    _w: _Workers[C]

    @property
    def workers(self) -> int:
        """Threads (and connections) this client runs calls on."""
        return self._w.size

    @property
    def closed(self) -> bool:
        """True once `close()` has run."""
        return self._w.closed

    def close(self) -> None:
        """Waits for the calls in flight, then closes every connection;
        later calls raise `fabrickv.Error` (`UNAVAILABLE`). Blocks: from a
        coroutine use `await aclose()` or `async with`."""
        self._w.close()

    async def aclose(self) -> None:
        """`close()` without blocking the event loop."""
        await asyncio.to_thread(self._w.close)

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_Self = TypeVar("_Self", bound=_AsyncBase[Any])


class _KvCalls(_AsyncBase[C]):
    """The kv calls of `AsyncClient` and `AsyncCluster`."""

    _w: _Workers[Any]

    async def get(self, key: bytes) -> bytes | None:
        """The value stored under `key`, or None."""
        return await self._w.run(lambda c: c.get(key))

    async def put(self, key: bytes, value: bytes, ttl: float | None = None) -> None:
        """Stores `value` under `key`, expiring after `ttl` seconds if given."""
        return await self._w.run(lambda c: c.put(key, value, ttl))

    async def delete(self, key: bytes) -> bool:
        """Removes `key`; True if it was there."""
        return await self._w.run(lambda c: c.delete(key))

    async def mget(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of `keys`, in order, None for each absent one."""
        return await self._w.run(lambda c: c.mget(keys))

    async def mput(self, items: Any, values: list[bytes] | None = None,
                   ttl: float | None = None) -> None:
        """Stores many values, as `Client.mput`."""
        return await self._w.run(lambda c: c.mput(items, values, ttl))


class _TableCalls(Generic[C]):
    """The calls of `AsyncTable` and `AsyncClusterTable`: each worker
    opens the table on its own client once."""

    def __init__(self, workers: _Workers[Any], name: str, dim: int) -> None:
        self._w = workers
        self._name = name
        self._dim = dim

    @property
    def name(self) -> str:
        """The table's name."""
        return self._name

    @property
    def dim(self) -> int:
        """Floats per vector."""
        return self._dim

    def _table(self, c: Any) -> Any:
        return self._w.cached("table:" + self._name, lambda cl: cl.table(self._name))

    @overload
    async def pull(self, keys: Any, out: None = None,
                   return_found: Literal[False] = False) -> npt.NDArray[np.float32]: ...

    @overload
    async def pull(self, keys: Any, out: T, return_found: Literal[False] = False) -> T: ...

    @overload
    async def pull(self, keys: Any, out: Any = None, *,
                   return_found: Literal[True]) -> tuple[Any, npt.NDArray[np.bool_]]: ...

    async def pull(self, keys: Any, out: Any = None, return_found: bool = False) -> Any:
        """The vectors of `keys`, as `Table.pull` (with `out=` they land in
        `out`, which is returned)."""
        return await self._w.run(
            lambda c: self._table(c).pull(keys, out=out, return_found=return_found))

    async def put(self, keys: Any, values: Any) -> None:
        """Stores `values` as the keys' vectors, as `Table.put`."""
        return await self._w.run(lambda c: self._table(c).put(keys, values))

    async def push(self, keys: Any, grads: Any) -> None:
        """Applies `grads` with the table's optimizer, as `Table.push`."""
        return await self._w.run(lambda c: self._table(c).push(keys, grads))

    def __repr__(self) -> str:
        return f"<fabrickv.{type(self).__name__} name={self._name!r} dim={self._dim}>"


class AsyncTable(_TableCalls[Client]):
    """An embedding table of an `AsyncClient`; calls as `Table`'s, awaited."""


class AsyncClusterTable(_TableCalls[Cluster]):
    """An embedding table of an `AsyncCluster`; calls as
    `ClusterTable`'s, awaited."""


class AsyncClient(_KvCalls[Client]):
    """`Client`'s calls, awaitable: `AsyncClient(addr, workers=4,
    timeout=5.0)` runs them on `workers` threads, each with its own
    `Client` (see the module doc)."""

    def __init__(self, addr: str, *, workers: int = DEFAULT_WORKERS,
                 timeout: float = 5.0) -> None:
        self._addr = addr
        self._w = _Workers(lambda: Client(addr, timeout=timeout), workers, "fabrickv-async")

    @property
    def addr(self) -> str:
        """The address the workers connect to."""
        return self._addr

    async def stats(self) -> dict[str, int]:
        """The server's counters, as `Client.stats`."""
        return await self._w.run(lambda c: c.stats())

    async def create_table(self, name: str, dim: int, optimizer: str = "sgd",
                           lr: float = 0.01, missing: str = "zeros",
                           seed: int = 0) -> AsyncTable:
        """Creates (or opens) an embedding table, as `Client.create_table`."""
        t: Table = await self._w.run(
            lambda c: c.create_table(name, dim, optimizer, lr, missing, seed))
        return AsyncTable(self._w, t.name, t.dim)

    async def table(self, name: str) -> AsyncTable:
        """Opens the existing table `name`, as `Client.table`."""
        t: Table = await self._w.run(lambda c: c.table(name))
        return AsyncTable(self._w, t.name, t.dim)

    async def tables(self) -> list[dict[str, Any]]:
        """Every embedding table as a dict, as `Client.tables`."""
        return await self._w.run(lambda c: c.tables())

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<fabrickv.AsyncClient addr={self._addr!r} workers={self.workers}{state}>"


class AsyncCluster(_KvCalls[Cluster]):
    """`Cluster`'s calls, awaitable: the constructor takes `Cluster`'s
    arguments and `workers`, each worker with its own `Cluster`."""

    def __init__(self, addrs: list[str] | None = None, *, config: str | Path | None = None,
                 registry: str | None = None, name: str = "default",
                 transport: str | None = None, timeout: float = 5.0,
                 read_from_replica: bool = False, workers: int = DEFAULT_WORKERS) -> None:
        def make() -> Cluster:
            return Cluster(addrs, config=config, registry=registry, name=name,
                           transport=transport, timeout=timeout,
                           read_from_replica=read_from_replica)
        self._w = _Workers(make, workers, "fabrickv-async-cluster")

    async def mdelete(self, keys: list[bytes]) -> list[bool]:
        """Removes many keys, as `Cluster.mdelete`."""
        return await self._w.run(lambda c: c.mdelete(keys))

    async def create_table(self, name: str, dim: int, optimizer: str = "sgd",
                           lr: float = 0.01, missing: str = "zeros",
                           seed: int = 0) -> AsyncClusterTable:
        """Creates (or opens) a table on every server, as
        `Cluster.create_table`."""
        t: ClusterTable = await self._w.run(
            lambda c: c.create_table(name, dim, optimizer, lr, missing, seed))
        return AsyncClusterTable(self._w, t.name, t.dim)

    async def table(self, name: str) -> AsyncClusterTable:
        """Opens the existing table `name`, as `Cluster.table`."""
        t: ClusterTable = await self._w.run(lambda c: c.table(name))
        return AsyncClusterTable(self._w, t.name, t.dim)

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<fabrickv.AsyncCluster workers={self.workers}{state}>"


class _CacheCalls(_AsyncBase[C]):
    """The calls of `AsyncCacheClient` and `AsyncClusterCache`."""

    _w: _Workers[Any]

    @overload
    async def get(self, key: bytes | str,
                  out: None = None) -> npt.NDArray[np.uint8] | None: ...

    @overload
    async def get(self, key: bytes | str, out: Any) -> int | None: ...

    async def get(self, key: bytes | str,
                  out: Any = None) -> npt.NDArray[np.uint8] | int | None:
        """The value of `key` (a new uint8 numpy array), or with `out` its
        length once copied into `out`; None if absent. As
        `CacheClient.get`."""
        return await self._w.run(lambda c: c.get(key, out))

    async def get_into(self, key: bytes | str, out: Any) -> int | None:
        """Reads the value of `key` into `out`, as `CacheClient.get_into`."""
        return await self._w.run(lambda c: c.get_into(key, out))

    async def get_many_into(self, keys: Sequence[bytes | str], outs: Any, *,
                            offsets: Sequence[int] | None = None,
                            sizes: int | Sequence[int] | None = None) -> list[int | None]:
        """Reads each key into its place, as `CacheClient.get_many_into`."""
        return await self._w.run(
            lambda c: c.get_many_into(keys, outs, offsets=offsets, sizes=sizes))

    async def put(self, key: bytes | str, value: Any, ttl: float | None = None) -> int:
        """Stores `value` under `key`, as `CacheClient.put`."""
        return await self._w.run(lambda c: c.put(key, value, ttl))

    async def put_many(self, items: Iterable[tuple[bytes | str, Any]],
                       ttl: float | None = None) -> list[int]:
        """Stores each `(key, value)`, as `CacheClient.put_many`."""
        listed = list(items)
        return await self._w.run(lambda c: c.put_many(listed, ttl))

    async def put_many_from(self, keys: Sequence[bytes | str], values: Any, *,
                            offsets: Sequence[int] | None = None,
                            sizes: int | Sequence[int] | None = None,
                            ttl: float | None = None) -> list[int]:
        """Stores each key from its place in `values`, as
        `CacheClient.put_many_from`."""
        return await self._w.run(
            lambda c: c.put_many_from(keys, values, offsets=offsets, sizes=sizes, ttl=ttl))

    async def delete(self, key: bytes | str) -> bool:
        """Removes `key`; True if it was there."""
        return await self._w.run(lambda c: c.delete(key))

    async def exists(self, key: bytes | str) -> bool:
        """Whether `key` is stored and not expired."""
        return await self._w.run(lambda c: c.exists(key))

    async def exists_many(self, keys: Sequence[bytes | str]) -> list[bool]:
        """Whether each key is stored, as `CacheClient.exists_many`."""
        return await self._w.run(lambda c: c.exists_many(keys))

    async def delete_many(self, keys: Sequence[bytes | str]) -> list[bool]:
        """Removes each key, as `CacheClient.delete_many`."""
        return await self._w.run(lambda c: c.delete_many(keys))

    async def prefix_hits(self, keys: Sequence[bytes | str]) -> int:
        """How many leading keys are stored, as `CacheClient.prefix_hits`."""
        return await self._w.run(lambda c: c.prefix_hits(keys))


class AsyncCacheClient(_CacheCalls[CacheClient]):
    """`CacheClient`'s calls, awaitable: `AsyncCacheClient(addr,
    buffer_mb=64, workers=2, timeout=5.0)`, each worker with its own
    `CacheClient` and so its own receive buffer of `buffer_mb` MiB."""

    def __init__(self, addr: str, *, buffer_mb: int = 64,
                 workers: int = DEFAULT_CACHE_WORKERS, timeout: float = 5.0) -> None:
        self._addr = addr
        self._w = _Workers(lambda: CacheClient(addr, buffer_mb=buffer_mb, timeout=timeout),
                           workers, "fabrickv-async-cache")

    @property
    def addr(self) -> str:
        """The address the workers connect to."""
        return self._addr

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<fabrickv.AsyncCacheClient addr={self._addr!r} workers={self.workers}{state}>"


class AsyncClusterCache(_CacheCalls[ClusterCache]):
    """`ClusterCache`'s calls, awaitable: the constructor takes
    `ClusterCache`'s arguments and `workers`, each worker with its own
    `ClusterCache` (a receive buffer per server per worker)."""

    def __init__(self, addrs: list[str] | None = None, *, config: str | Path | None = None,
                 registry: str | None = None, name: str = "default",
                 transport: str | None = None, buffer_mb: int = 64, timeout: float = 5.0,
                 workers: int = DEFAULT_CACHE_WORKERS) -> None:
        def make() -> ClusterCache:
            return ClusterCache(addrs, config=config, registry=registry, name=name,
                                transport=transport, buffer_mb=buffer_mb, timeout=timeout)
        self._w = _Workers(make, workers, "fabrickv-async-cluster-cache")

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<fabrickv.AsyncClusterCache workers={self.workers}{state}>"

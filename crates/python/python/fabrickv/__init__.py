"""FabricKV's Python client.

Blocking clients (`Client`, `CacheClient`, `Cluster`, `ClusterCache` and
their embedding tables) are the native extension `fabrickv._native`; the
asyncio forms (`AsyncClient`, `AsyncCacheClient`, `AsyncCluster`,
`AsyncClusterCache`) run those on a fixed pool of worker threads, each
with its own connection (`fabrickv.aio`); `fabrickv.blocks` names KV-cache
blocks by chained prefix hashes. Every failed call raises `Error`, whose
`code` is a stable name ("TIMEOUT", "BUFFER_TOO_SMALL", ...).

Memory in and out (values, gradients, `out=`) is seen in place: numpy
arrays, objects with the buffer protocol (bytes, bytearray, memoryview),
and CPU tensors with `__dlpack__` (torch, bfloat16 included).
"""

from ._native import (
    CacheClient as CacheClient,
    Client as Client,
    Cluster as Cluster,
    ClusterCache as ClusterCache,
    ClusterTable as ClusterTable,
    Error as Error,
    PullHandle as PullHandle,
    Table as Table,
    __version__ as __version__,
    barrier as barrier,
    lookup as lookup,
    set_auth_token_file as set_auth_token_file,
)
from . import blocks as blocks
from .aio import (
    AsyncCacheClient as AsyncCacheClient,
    AsyncClient as AsyncClient,
    AsyncCluster as AsyncCluster,
    AsyncClusterCache as AsyncClusterCache,
    AsyncClusterTable as AsyncClusterTable,
    AsyncTable as AsyncTable,
)

__all__ = [
    "AsyncCacheClient",
    "AsyncClient",
    "AsyncCluster",
    "AsyncClusterCache",
    "AsyncClusterTable",
    "AsyncTable",
    "CacheClient",
    "Client",
    "Cluster",
    "ClusterCache",
    "ClusterTable",
    "Error",
    "PullHandle",
    "Table",
    "__version__",
    "barrier",
    "blocks",
    "lookup",
    "set_auth_token_file",
]

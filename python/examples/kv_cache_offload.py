"""Offload an inference engine's attention KV cache to FabricKV and load it
back when a later request starts with the same prompt.

An engine keeps, per block of BLOCK prompt tokens, the attention keys and
values of every layer: a float16 tensor of shape

    (layers, 2, heads, block, head_dim)        # 2: keys, then values

When its accelerator memory runs short it offloads finished blocks to the
cache and frees them. A block's cache key hashes the tokens of the block
and of every block before it (as prefix caching does), so a later request
with the same prefix finds exactly the blocks it can reuse, and misses
from the first block that differs on.

This script plays a chat's two turns with random stand-in tensors (no
model), the way an engine's connector would talk to the cache:

1. turn A names its prompt's blocks with `fabrickv.blocks.prefix_keys`
   and offloads them with one `put_many_from`, each block handed over as
   a DLPack tensor (a torch tensor in an engine; here numpy's own DLPack
   export, so no copy into bytes is made);
2. turn B's prompt is A's followed by new tokens: `prefix_hits` says how
   many of its leading blocks are cached, in one round trip, and
   `get_many_into` reloads exactly those, straight into one preallocated
   array (one slot per block; over shm, memory from `register_buffer`
   that the server writes the blocks into itself); the engine would
   recompute the rest.

It checks that every reloaded block equals what A offloaded, that B finds
exactly A's blocks, and prints one summary line

    offload blocks=<n> bytes=<n> reused=<n> recomputed=<n> one_sided=<bool>

Usage: python kv_cache_offload.py [HOST:PORT | shm://NAME] [--blocks N] ...
Needs a running `fabrickv serve` (default address 127.0.0.1:7379). Exits 1
if a check fails.
"""

import argparse
import sys
import time
from typing import Any

import numpy as np

import fabrickv
from fabrickv.blocks import prefix_keys

# The model the blocks belong to: part of every key, so two models never
# share blocks.
MODEL = "example-model"


class DlpackBlock:
    """A block as an engine hands it over: a tensor seen through
    `__dlpack__` only (torch's, in an engine; numpy's export here)."""

    def __init__(self, array: "np.ndarray[Any, Any]") -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> "tuple[int, int]":
        device: "tuple[int, int]" = self.array.__dlpack_device__()
        return device


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("addr", nargs="?", default="127.0.0.1:7379",
                    help="server address (default 127.0.0.1:7379)")
    ap.add_argument("--blocks", type=int, default=8, help="blocks in turn A's prompt")
    ap.add_argument("--new-blocks", type=int, default=2,
                    help="blocks turn B adds after A's prompt")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--block", type=int, default=16, help="tokens per block")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--ttl", type=float, default=300.0,
                    help="seconds offloaded blocks stay in the cache")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    shape = (args.layers, 2, args.heads, args.block, args.head_dim)
    prompt_a = rng.integers(0, 32000, size=args.blocks * args.block)
    # Turn B: A's prompt, new tokens, and a partial block being filled
    # (not keyed until it is whole).
    prompt_b = np.concatenate(
        [prompt_a, rng.integers(0, 32000, size=args.new_blocks * args.block + 3)])
    # A per-run seed keeps runs against one server apart.
    run_seed = int(rng.integers(0, 2**63))
    keys_a = prefix_keys(prompt_a, args.block, MODEL, run_seed)
    keys_b = prefix_keys(prompt_b, args.block, MODEL, run_seed)

    with fabrickv.CacheClient(args.addr) as cache:
        # Turn A: its blocks, as the engine's attention layers left them.
        # (The script keeps them only to check what comes back.)
        kv_a = [rng.standard_normal(shape).astype(np.float16) for _ in keys_a]
        start = time.monotonic()
        cache.put_many_from(keys_a, [DlpackBlock(b) for b in kv_a], ttl=args.ttl)
        offload_s = time.monotonic() - start
        offloaded = sum(b.nbytes for b in kv_a)

        # Turn B: how much of its prompt is cached, then those blocks
        # straight into one preallocated array, a slot per block: memory
        # registered with the server where the transport allows it (shm),
        # which the server writes each block into itself, else a plain
        # array the client copies the blocks into.
        block_bytes = int(np.prod(shape)) * np.dtype(np.float16).itemsize
        raw = (cache.register_buffer(len(keys_b) * block_bytes) if cache.one_sided
               else np.empty(len(keys_b) * block_bytes, np.uint8))
        kv_b = raw.view(np.float16).reshape((len(keys_b),) + shape)
        start = time.monotonic()
        reused = cache.prefix_hits(keys_b)
        lengths = cache.get_many_into(
            keys_b[:reused], raw,
            offsets=[i * block_bytes for i in range(reused)], sizes=block_bytes)
        reload_s = time.monotonic() - start
        recomputed = len(keys_b) - reused

        ok = True
        if reused != len(keys_a):
            print(f"turn B reused {reused} blocks, expected turn A's {len(keys_a)}",
                  file=sys.stderr)
            ok = False
        if lengths != [block_bytes] * reused:
            print(f"reloaded lengths {lengths}, expected {block_bytes} each", file=sys.stderr)
            ok = False
        for i in range(min(reused, len(kv_a))):
            if not np.array_equal(kv_b[i], kv_a[i]):
                print(f"block {i} came back different", file=sys.stderr)
                ok = False
        one_sided = cache.one_sided

    print(f"offloaded {len(keys_a)} blocks of {shape} float16 ({offloaded} bytes) "
          f"in {offload_s * 1e3:.1f} ms; reloaded {reused} in {reload_s * 1e3:.1f} ms")
    print(f"offload blocks={len(keys_a)} bytes={offloaded} reused={reused} "
          f"recomputed={recomputed} one_sided={one_sided}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

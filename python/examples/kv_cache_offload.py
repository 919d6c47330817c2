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
model):

1. turn A computes the blocks of its prompt and offloads each with `put`;
2. turn B's prompt is A's followed by new tokens: it reloads the blocks it
   finds with `get_into`, straight into one preallocated array, and would
   recompute the rest (the new ones).

It checks that every reloaded block equals what A offloaded, that B finds
exactly A's blocks, and prints one summary line

    offload blocks=<n> bytes=<n> reused=<n> recomputed=<n> one_sided=<bool>

Usage: python kv_cache_offload.py [HOST:PORT | shm://NAME] [--blocks N] ...
Needs a running `fabrickv serve` (default address 127.0.0.1:7379). Exits 1
if a check fails.
"""

import argparse
import hashlib
import sys
import time

import numpy as np

import fabrickv


def block_keys(tokens, block):
    """The cache key of each whole block of `tokens`: a hash of the block's
    tokens chained to the previous block's key, so that equal keys mean
    equal prefixes."""
    keys, prev = [], b""
    for start in range(0, len(tokens) - block + 1, block):
        h = hashlib.sha256(prev)
        h.update(np.asarray(tokens[start:start + block], dtype=np.int64).tobytes())
        prev = h.digest()
        keys.append(b"kv/" + h.hexdigest().encode())
    return keys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    prompt_b = np.concatenate(
        [prompt_a, rng.integers(0, 32000, size=args.new_blocks * args.block)])
    keys_a = block_keys(prompt_a, args.block)
    keys_b = block_keys(prompt_b, args.block)

    with fabrickv.CacheClient(args.addr) as cache:
        # Turn A: its blocks, as the engine's attention layers left them.
        # (The script keeps them only to check what comes back.)
        kv_a = [rng.standard_normal(shape).astype(np.float16) for _ in keys_a]
        start = time.monotonic()
        for key, block in zip(keys_a, kv_a):
            cache.put(key, block, ttl=args.ttl)
        offload_s = time.monotonic() - start
        offloaded = sum(b.nbytes for b in kv_a)

        # Turn B: one preallocated array for its whole prompt, filled in
        # place from the cache; the first miss ends the reusable prefix.
        kv_b = np.empty((len(keys_b),) + shape, dtype=np.float16)
        start = time.monotonic()
        reused = 0
        for i, key in enumerate(keys_b):
            n = cache.get_into(key, kv_b[i])
            if n is None:
                break
            if n != kv_b[i].nbytes:
                print(f"block {i}: {n} bytes, expected {kv_b[i].nbytes}", file=sys.stderr)
                return 1
            reused += 1
        reload_s = time.monotonic() - start
        recomputed = len(keys_b) - reused

        ok = True
        if reused != len(keys_a):
            print(f"turn B reused {reused} blocks, expected turn A's {len(keys_a)}",
                  file=sys.stderr)
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

"""Names for the blocks of an LLM's attention KV cache, by chained prefix
hashes.

An inference engine cuts a prompt's token ids into blocks of
`block_size` tokens and caches each block's keys and values. A block's
contents depend on every token before it, so its name must too: block
`i`'s key hashes block `i - 1`'s hash together with block `i`'s own
tokens (as vLLM's prefix caching, LMCache and Mooncake do). Two requests
that share their first `n` blocks of tokens then share the first `n`
keys, and the first block that differs changes every key after it.

The hashes are SHA-256 over a fixed byte layout, so any process, any
engine and any language reaches the same keys from the same tokens:

    root    = SHA256(b"fabrickv.blocks.v1\\0" || u32le(len(model)) || model
                     || u64le(seed) || u32le(block_size))
    h[i]    = SHA256(h[i-1] || u64le(token) for each token of block i)
              with h[-1] = root
    key[i]  = b"kvb1:" || hex(h[i])                 (69 bytes)

`model` (its UTF-8 bytes) and `seed` are in the root, so two models, or
two deployments that must not share blocks, never meet. A last block of
fewer than `block_size` tokens is not keyed: it is still being filled.
"""

import hashlib
import struct
from typing import Sequence, Union

import numpy as np
import numpy.typing as npt

__all__ = ["KEY_PREFIX", "prefix_keys", "root_hash"]

# What every key starts with; the version changes if the layout does.
KEY_PREFIX = b"kvb1:"

# Domain tag of the root hash, so that these hashes never collide with
# hashes of other layouts over the same bytes.
_DOMAIN = b"fabrickv.blocks.v1\0"

# Largest block and model name accepted: u32 fields of the layout.
_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1

TokenIds = Union[Sequence[int], "npt.NDArray[np.integer]"]


def root_hash(model: str, seed: int, block_size: int) -> bytes:
    """The hash chained before a prompt's first block (32 bytes)."""
    if not isinstance(model, str):
        raise TypeError(f"model must be a str, not {type(model).__name__}")
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, not {type(block_size).__name__}")
    if not 0 < block_size <= _U32_MAX:
        raise ValueError(f"block_size must be in 1..={_U32_MAX}, not {block_size}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, not {type(seed).__name__}")
    if not 0 <= seed <= _U64_MAX:
        raise ValueError(f"seed must be in 0..2**64, not {seed}")
    name = model.encode("utf-8")
    if len(name) > _U32_MAX:
        raise ValueError("model name too long")
    h = hashlib.sha256(_DOMAIN)
    h.update(struct.pack("<I", len(name)))
    h.update(name)
    h.update(struct.pack("<QI", seed, block_size))
    return h.digest()


def prefix_keys(token_ids: TokenIds, block_size: int, model: str,
                seed: int = 0) -> list[bytes]:
    """The cache key of each whole block of `token_ids` (a 1-D sequence
    of non-negative integers: a list, a numpy array, a CPU tensor), in
    order: `len(token_ids) // block_size` keys, each chained to every
    block before it (see the module doc)."""
    tokens = np.asarray(token_ids)
    if tokens.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tokens.shape}")
    if tokens.size and tokens.dtype.kind not in "iu":
        raise TypeError(f"token_ids must be integers, got dtype {tokens.dtype}")
    if tokens.size and tokens.dtype.kind == "i" and int(tokens.min()) < 0:
        raise ValueError(f"token ids must be non-negative, got {int(tokens.min())}")
    prev = root_hash(model, seed, block_size)
    whole = len(tokens) // block_size
    raw = np.ascontiguousarray(tokens[:whole * block_size], dtype="<u8").tobytes()
    step = block_size * 8
    keys = []
    for i in range(whole):
        h = hashlib.sha256(prev)
        h.update(raw[i * step:(i + 1) * step])
        prev = h.digest()
        keys.append(KEY_PREFIX + prev.hex().encode("ascii"))
    return keys

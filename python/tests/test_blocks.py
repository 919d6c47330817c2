"""`fabrickv.blocks.prefix_keys`: KV blocks named by chained prefix
hashes. The keys are the same in every process (no per-process hash
seed), follow the layout the module documents byte for byte, chain (a
block's key changes with any token before it, never with one after it),
and leave a partial last block unkeyed."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

import numpy as np
import pytest

import fabrickv
from fabrickv.blocks import KEY_PREFIX, prefix_keys, root_hash

TOKENS = list(range(1000, 1000 + 64))


def test_keys_follow_the_documented_layout() -> None:
    # Computed here from the layout in the module doc, not from the module.
    h = hashlib.sha256(b"fabrickv.blocks.v1\0")
    h.update(struct.pack("<I", 5) + b"llama")
    h.update(struct.pack("<QI", 7, 16))
    prev = h.digest()
    want = []
    for i in range(4):
        step = hashlib.sha256(prev)
        step.update(struct.pack("<16Q", *TOKENS[i * 16:(i + 1) * 16]))
        prev = step.digest()
        want.append(b"kvb1:" + prev.hex().encode())
    assert prefix_keys(TOKENS, 16, "llama", 7) == want
    assert root_hash("llama", 7, 16) == hashlib.sha256(
        b"fabrickv.blocks.v1\0" + struct.pack("<I", 5) + b"llama"
        + struct.pack("<QI", 7, 16)).digest()


def test_keys_are_the_same_in_another_process() -> None:
    code = ("import fabrickv.blocks as b;"
            f"print(b'|'.join(b.prefix_keys({TOKENS!r}, 16, 'llama', 7)).decode())")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env={"PYTHONHASHSEED": "random"}).stdout.strip()
    assert out.encode().split(b"|") == prefix_keys(TOKENS, 16, "llama", 7)


def test_keys_chain_on_everything_before_and_nothing_after() -> None:
    base = prefix_keys(TOKENS, 16, "m")
    changed = list(TOKENS)
    changed[20] += 1  # in block 1
    other = prefix_keys(changed, 16, "m")
    assert other[0] == base[0]
    assert all(a != b for a, b in zip(other[1:], base[1:]))
    # A longer prompt with the same start shares the start's keys.
    longer = prefix_keys(TOKENS + [5] * 40, 16, "m")
    assert longer[:4] == base and len(longer) == 6


def test_a_partial_last_block_is_not_keyed() -> None:
    assert len(prefix_keys(TOKENS[:47], 16, "m")) == 2
    assert prefix_keys(TOKENS[:15], 16, "m") == []
    assert prefix_keys([], 16, "m") == []


def test_model_seed_and_block_size_separate_the_keys() -> None:
    base = prefix_keys(TOKENS, 16, "a", 0)
    assert set(base).isdisjoint(prefix_keys(TOKENS, 16, "b", 0))
    assert set(base).isdisjoint(prefix_keys(TOKENS, 16, "a", 1))
    assert set(base).isdisjoint(prefix_keys(TOKENS, 8, "a", 0))


def test_any_integer_sequence_gives_the_same_keys() -> None:
    want = prefix_keys(TOKENS, 16, "m")
    assert prefix_keys(np.array(TOKENS, dtype=np.int32), 16, "m") == want
    assert prefix_keys(np.array(TOKENS, dtype=np.uint64), 16, "m") == want
    assert prefix_keys(tuple(TOKENS), 16, "m") == want
    assert all(k.startswith(KEY_PREFIX) and len(k) == 69 for k in want)
    assert fabrickv.blocks.prefix_keys is prefix_keys


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        prefix_keys([1, -2, 3], 1, "m")
    with pytest.raises(TypeError, match="integers"):
        prefix_keys([1.5, 2.0], 1, "m")  # type: ignore[list-item]
    with pytest.raises(ValueError, match="1-D"):
        prefix_keys([[1, 2]], 1, "m")  # type: ignore[list-item]
    with pytest.raises(ValueError, match="block_size"):
        prefix_keys(TOKENS, 0, "m")
    with pytest.raises(TypeError, match="model"):
        prefix_keys(TOKENS, 16, b"m")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        prefix_keys(TOKENS, 16, "m", -1)

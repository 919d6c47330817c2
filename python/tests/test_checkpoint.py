"""Checkpoints from Python: `Client.checkpoint_save` has a running server
save its keys and embedding tables; a server started with `--restore` on
that checkpoint answers them all, on each native transport."""

from pathlib import Path

import numpy as np
import pytest

import fabrickv
from conftest import PS_POOL_ARGS, TRANSPORTS, Server, listen_addr

# Long enough for a small save on a machine busy with other work.
SAVE_WAIT_S = 120.0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_saved_keys_and_tables_come_back_after_a_restart(transport: str, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    s = Server(*PS_POOL_ARGS, "--checkpoint-dir", str(root), listen=listen_addr(transport))
    try:
        with fabrickv.Client(s.native) as c:
            assert c.checkpoint_status()["last_save"] == 0
            c.mput({f"k{i}".encode(): f"v{i}".encode() * 10 for i in range(500)})
            c.put(b"ttl", b"kept", ttl=3600)
            t = c.create_table("emb", dim=8, optimizer="adagrad", lr=0.1)
            keys = np.arange(1, 101, dtype=np.uint64)
            t.put(keys, np.ones((100, 8), dtype=np.float32))
            t.push(keys, np.full((100, 8), 0.5, dtype=np.float32))
            before = t.pull(keys)
            st = c.checkpoint_save("py")
            assert st["error"] is None and not st["saving"]
            assert st["dir"].startswith(str(root / "py")), st
            assert st["last_save"] > 0 and st["finished"] == 1
            # What one more push makes of the saved state: the restored
            # table must step the same way, which needs its Adagrad
            # accumulators back, not only its vectors.
            t.push(keys, np.full((100, 8), 0.25, dtype=np.float32))
            stepped = t.pull(keys)
            # Outside the server's checkpoint directory: refused by code.
            with pytest.raises(fabrickv.Error) as e:
                c.checkpoint_save(str(tmp_path / "elsewhere"))
            assert e.value.code == "CHECKPOINT_REFUSED"
    finally:
        assert s.stop() == 0
    r = Server(*PS_POOL_ARGS, "--restore", st["dir"], listen=listen_addr(transport))
    try:
        with fabrickv.Client(r.native) as c:
            assert c.mget([f"k{i}".encode() for i in range(500)]) == [
                f"v{i}".encode() * 10 for i in range(500)]
            assert c.get(b"ttl") == b"kept"
            t = c.table("emb")
            assert (t.dim, t.optimizer) == (8, "adagrad")
            np.testing.assert_array_equal(t.pull(keys), before)
            t.push(keys, np.full((100, 8), 0.25, dtype=np.float32))
            np.testing.assert_array_equal(t.pull(keys), stepped)
            assert len(t) == 100
    finally:
        assert r.stop() == 0

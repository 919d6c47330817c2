"""Train embeddings kept in a FabricKV table: pull a minibatch, compute the
loss and its gradient with numpy, push the gradient back, repeat.

The task is a toy one so that the loop is the whole story: each key has a
fixed random target vector, and its embedding should move to it. The loss
of a key is the mean squared error over the vector's elements,

    loss = mean((e - target) ** 2)        grad = 2 * (e - target) / dim

and the server applies each pushed gradient with the table's optimizer
(here SGD: e -= lr * grad), atomically per key, so several trainers may
push into one table at once.

Usage: python train_embedding.py [HOST:PORT | shm://NAME] [--steps N] ...
Needs a running `fabrickv serve` (default address 127.0.0.1:7379). Prints
the loss as it goes and ends with one line

    final loss_start=<float> loss_end=<float>

and exits 1 if the loss did not decrease.
"""

import argparse
import sys
from typing import Any

import numpy as np

import fabrickv

DIM = 16


def loss_and_grad(embeddings: "np.ndarray[Any, Any]",
                  targets: "np.ndarray[Any, Any]") -> "tuple[float, np.ndarray[Any, Any]]":
    """Mean squared error per key, averaged over the batch, and the
    gradient of each key's own loss with respect to its embedding."""
    diff = embeddings - targets
    loss = float(np.mean(diff * diff))
    grad = (2.0 / DIM) * diff
    return loss, grad.astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("addr", nargs="?", default="127.0.0.1:7379",
                    help="server address (default 127.0.0.1:7379)")
    ap.add_argument("--table", default="example_embedding",
                    help="table name (created if absent)")
    ap.add_argument("--keys", type=int, default=1000, help="keys 1..=KEYS are trained")
    ap.add_argument("--batch", type=int, default=64, help="keys per minibatch")
    ap.add_argument("--steps", type=int, default=300, help="minibatches")
    ap.add_argument("--lr", type=float, default=1.0, help="SGD learning rate")
    ap.add_argument("--seed", type=int, default=0, help="seed of targets and batches")
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    keys = np.arange(1, args.keys + 1, dtype=np.uint64)
    # The target of key k is row k - 1.
    targets = rng.normal(size=(args.keys, DIM)).astype(np.float32)

    with fabrickv.Client(args.addr) as client:
        # missing="init": a key never trained starts from the table's small
        # random initializer, the vector its first gradient is applied to.
        table = client.create_table(args.table, dim=DIM, optimizer="sgd",
                                    lr=args.lr, missing="init")

        def full_loss() -> float:
            return loss_and_grad(table.pull(keys), targets)[0]

        loss_start = full_loss()
        print(f"step 0: loss {loss_start:.6f} over {args.keys} keys")
        for step in range(1, args.steps + 1):
            batch = rng.choice(keys, size=args.batch, replace=False)
            embeddings = table.pull(batch)                  # (batch, DIM) float32
            loss, grad = loss_and_grad(embeddings, targets[batch - 1])
            table.push(batch, grad)                         # e -= lr * grad, on the server
            if step % 100 == 0:
                print(f"step {step}: minibatch loss {loss:.6f}")
        loss_end = full_loss()

    print(f"final loss_start={loss_start:.6f} loss_end={loss_end:.6f}")
    if not loss_end < loss_start:
        print("the loss did not decrease", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

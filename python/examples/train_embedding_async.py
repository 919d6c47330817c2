"""Train embeddings kept in a FabricKV table from asyncio: the same toy
task as train_embedding.py (each key's embedding moves toward a fixed
random target), with several minibatches in flight at once.

Each step pulls `--in-flight` minibatches together with `asyncio.gather`
(each into its own preallocated array, `out=`), computes their gradients
with numpy, and pushes them back together. The `AsyncClient` runs the
calls on its worker threads, each with its own connection, so the pulls
of one step travel in parallel instead of one after another; the event
loop stays free for whatever else the program does.

Usage: python train_embedding_async.py [HOST:PORT | shm://NAME] [--steps N] ...
Needs a running `fabrickv serve` (default address 127.0.0.1:7379). Prints
the loss as it goes and ends with one line

    final loss_start=<float> loss_end=<float>

and exits 1 if the loss did not decrease.
"""

import argparse
import asyncio
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


async def train(args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    keys = np.arange(1, args.keys + 1, dtype=np.uint64)
    targets = rng.normal(size=(args.keys, DIM)).astype(np.float32)

    async with fabrickv.AsyncClient(args.addr, workers=args.workers) as client:
        table = await client.create_table(args.table, dim=DIM, optimizer="sgd",
                                          lr=args.lr, missing="init")
        everything = np.empty((args.keys, DIM), np.float32)

        async def full_loss() -> float:
            await table.pull(keys, out=everything)
            return loss_and_grad(everything, targets)[0]

        loss_start = await full_loss()
        print(f"step 0: loss {loss_start:.6f} over {args.keys} keys")
        # One preallocated array per minibatch in flight, reused each step.
        outs = [np.empty((args.batch, DIM), np.float32) for _ in range(args.in_flight)]
        for step in range(1, args.steps + 1):
            # Disjoint minibatches, so that no key gets two gradients from
            # one pull (the pushes still apply atomically per key).
            chosen = rng.choice(keys, size=args.batch * args.in_flight, replace=False)
            batches = chosen.reshape(args.in_flight, args.batch)
            await asyncio.gather(*(table.pull(b, out=o) for b, o in zip(batches, outs)))
            losses, grads = zip(*(loss_and_grad(o, targets[b - 1])
                                  for b, o in zip(batches, outs)))
            await asyncio.gather(*(table.push(b, g) for b, g in zip(batches, grads)))
            if step % 100 == 0:
                print(f"step {step}: minibatch loss {float(np.mean(losses)):.6f}")
        loss_end = await full_loss()

    print(f"final loss_start={loss_start:.6f} loss_end={loss_end:.6f}")
    if not loss_end < loss_start:
        print("the loss did not decrease", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("addr", nargs="?", default="127.0.0.1:7379",
                    help="server address (default 127.0.0.1:7379)")
    ap.add_argument("--table", default="example_embedding_async",
                    help="table name (created if absent)")
    ap.add_argument("--keys", type=int, default=1000, help="keys 1..=KEYS are trained")
    ap.add_argument("--batch", type=int, default=64, help="keys per minibatch")
    ap.add_argument("--in-flight", type=int, default=4,
                    help="minibatches pulled and pushed at once")
    ap.add_argument("--workers", type=int, default=4, help="the client's worker threads")
    ap.add_argument("--steps", type=int, default=300, help="steps of --in-flight minibatches")
    ap.add_argument("--lr", type=float, default=1.0, help="SGD learning rate")
    ap.add_argument("--seed", type=int, default=0, help="seed of targets and batches")
    args = ap.parse_args()
    if args.batch * args.in_flight > args.keys:
        ap.error("--batch x --in-flight must not exceed --keys")
    return asyncio.run(train(args))


if __name__ == "__main__":
    sys.exit(main())

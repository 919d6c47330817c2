"""Spread keys and embedding rows over a FabricKV cluster and check where
they landed.

Stores KEYS keys with one `mput` (split by server, every part sent at
once), reads them back with one `mget` in request order, asks each server
alone which keys it holds (each must hold exactly the keys the cluster
says it owns), then puts, pulls and pushes the rows of an embedding table
spread the same way. Prints one summary line

    cluster servers=<n> keys=<n> per_server=<a,b,...> rows=<n>

Usage: python cluster_kv.py ADDR [ADDR ...] [--keys N]
       python cluster_kv.py --registry memcached://HOST:PORT [--name NAME]
Needs running `fabrickv serve` processes (with `--registry`, registered
under NAME). Exits 1 if a check fails.
"""

import argparse
import sys
import uuid

import numpy as np

import fabrickv


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("addrs", nargs="*", help="server i's address, in id order")
    ap.add_argument("--registry", help="memcached://HOST:PORT to find the servers in")
    ap.add_argument("--name", default="default", help="the cluster's name in the registry")
    ap.add_argument("--keys", type=int, default=1000, help="keys to spread")
    args = ap.parse_args()
    if bool(args.addrs) == bool(args.registry):
        ap.error("give server addresses or --registry, not both")

    if args.registry:
        c = fabrickv.Cluster(registry=args.registry, name=args.name)
    else:
        c = fabrickv.Cluster(args.addrs)
    run = uuid.uuid4().hex[:8]
    keys = [f"example/{run}/{i}".encode() for i in range(args.keys)]
    values = [f"value {i}".encode() for i in range(args.keys)]
    c.mput(keys, values)
    if c.mget(keys) != values:
        sys.exit("mget did not return what mput stored, in order")

    per_server = []
    for sid in range(c.size):
        mine = [k for k in keys if c.server_of(k) == sid]
        addr = c.addr(sid)
        if addr is None:
            sys.exit(f"server {sid} has no address")
        with fabrickv.Client(addr) as one:
            held = [k for k, v in zip(keys, one.mget(keys)) if v is not None]
        if held != mine:
            sys.exit(f"server {sid} holds {len(held)} keys; it owns {len(mine)}")
        per_server.append(len(mine))
    c.mdelete(keys)

    t = c.create_table(f"example-{run}", dim=16, optimizer="sgd", lr=1.0)
    ids = np.arange(args.keys, dtype=np.uint64)
    rows = np.random.default_rng(0).standard_normal((args.keys, 16)).astype(np.float32)
    t.put(ids, rows)
    out = np.empty_like(rows)
    t.pull(ids, out=out)
    t.push(ids, rows)                       # w -= 1.0 * w: every row becomes 0
    if not np.array_equal(out, rows) or np.any(t.pull(ids)):
        sys.exit("the table's rows are not what was put and pushed")

    print(f"cluster servers={c.size} keys={args.keys} "
          f"per_server={','.join(map(str, per_server))} rows={args.keys}")
    c.close()


if __name__ == "__main__":
    main()

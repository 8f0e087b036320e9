"""Checkpoint latency of a primary after each interval of writes, per flush-thread count.

    .venv/bin/python bench/checkpoint_latency.py --flush-threads 1,2 --rounds 12 --out bench/results/checkpoint-latency.jsonl

The state is the overhead benchmark's (rhino-bench overhead): instance 0 of 8
over 256 vnodes (32 vnodes), 1M int64 keys with random 128-byte values, then
rounds of `--interval` seconds of put_batch (20k keys, uniformly chosen
updates) each followed by a timed checkpoint into a local store (the newest 4
kept). One JSON line per flush-thread count, the counts alternating when
`--repeats` > 1, all in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timezone

import numpy as np

import rhino
from rhino._machine import describe_machine
from rhino_testing.workload import keys_for, random_values


def one(flush_threads: int, rounds: int, interval: float, base: str) -> dict:
    d = tempfile.mkdtemp(dir=base)
    try:
        part = rhino.Partitioner()
        vnodes = rhino.RoutingTable.from_ring(num_vnodes=256, num_instances=8).vnodes_of(0)
        db = rhino.StateBackend.open(d + "/db", partitioner=part, vnodes=vnodes, flush_threads=flush_threads)
        store = rhino.ReplicaStore(d + "/store")
        gen = np.random.default_rng(1)
        keys = keys_for(0, 8_000_000)
        keys = keys[np.isin(part.vnodes(keys), vnodes)][:1_000_000]
        db.put_batch(keys, random_values(gen, len(keys), 128))
        db.checkpoint(store, 1)
        seconds, deltas = [], []
        for cid in range(2, rounds + 2):
            end = time.time() + interval
            while time.time() < end:
                db.put_batch(keys[gen.integers(0, len(keys), 20_000)], random_values(gen, 20_000, 128))
            t = time.perf_counter()
            m = db.checkpoint(store, cid)
            seconds.append(time.perf_counter() - t)
            deltas.append(m.delta_bytes)
            store.retain("op", 0, 4)
            store.gc()
        db.close()
        return {"flush_threads": flush_threads, "checkpoint_median_s": statistics.median(seconds),
                "checkpoint_s": seconds, "delta_bytes": deltas}
    finally:
        shutil.rmtree(d)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flush-threads", default="1,2", help="comma-separated flush-thread counts")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dir", default=".", help="where the temporary state lives")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = p.parse_args()
    counts = [int(x) for x in args.flush_threads.split(",")]
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
    for _ in range(args.repeats):
        for n in counts:
            row = one(n, args.rounds, args.interval, args.dir)
            row.update({"run_id": run_id, "rounds": args.rounds, "interval_s": args.interval,
                        "command": "python bench/checkpoint_latency.py " + " ".join(
                            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
                        "machine": describe_machine(args.dir)})
            line = json.dumps(row)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()

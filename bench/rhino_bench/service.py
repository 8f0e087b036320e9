"""The state service against the in-process state backend, in the same run (issue 18).

    rhino-bench service --json --out bench/results/service.jsonl         --plot bench/results/service.png --report bench/results/service.md

How it runs and what each record holds: bench/README.md, "State service".
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import rhino

from rhino_testing.harness.workers import SECRET, start_workers, write_secret
from .common import JsonLines, exit_on_sigterm, io_flags
from .report import md_table, pyplot, save, write_lines

THROUGHPUT_TARGET = 0.70  # Unix-socket keys/s over in-process keys/s
OPEN_TARGET_MS = 2.0
NUM_VNODES = 64


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _throughput_row(op: str, transport: str, seconds: list[float], ratios: list[float], keys: int,
                    args: argparse.Namespace) -> dict:
    med = np.median(seconds)
    row = {"figure": "throughput", "op": op, "transport": transport, "keys": keys, "value_bytes": args.value_bytes,
           "repeat": len(seconds), "seconds_median": round(med, 6), "seconds_min": round(min(seconds), 6),
           "keys_per_s": round(keys / med)}
    if transport != "in-process":
        # The median over rounds of (in-process time / session time), each round
        # timing the three ways back to back: the machine's noise (other
        # tenants' CPU, the disk) hits the baseline and the session alike.
        row["ratio_to_inprocess"] = round(np.median(ratios), 3)
        row["ratio_min"] = round(min(ratios), 3)
        row["ratio_max"] = round(max(ratios), 3)
        if transport == "unix" and op in ("put", "get"):
            row["target"] = THROUGHPUT_TARGET
            row["target_met"] = row["ratio_to_inprocess"] >= THROUGHPUT_TARGET
    return row


def run(args: argparse.Namespace, emit: Callable[[dict], None]) -> None:
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    n = args.keys
    keys = np.arange(n, dtype=np.int64)
    values = np.random.default_rng(0).integers(0, 256, size=(n, args.value_bytes), dtype=np.uint8)
    emit({"figure": "setup", "command": "rhino-bench service " + " ".join(args.argv), "keys": n,
          "value_bytes": args.value_bytes, "repeat": args.repeat, "fixed_reps": args.fixed_reps,
          "num_vnodes": NUM_VNODES, "cpus": os.cpu_count(), "python": platform.python_version(),
          "rhino": rhino.__version__, "unix": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    secret_file = write_secret(root, SECRET)
    workers = start_workers(root, [2, 3, 4], secret_file, max_window=64)
    part = rhino.Partitioner(num_vnodes=NUM_VNODES)
    store = rhino.ReplicaStore(str(root / "inproc-store"))
    # Two in-process baselines, each in the state the session's instance is in:
    # `db_put` takes the bare put_batch calls; `db` is written and checkpointed
    # every round like the worker's instance (a checkpoint flushes the
    # memtables, so its gets read SSTs, not the memtable a put just filled).
    db_put = rhino.StateBackend.open(str(root / "inproc-put"), partitioner=part, operator_id="inproc")
    db = rhino.StateBackend.open(str(root / "inproc"), partitioner=part, operator_id="inproc")
    clients: dict[str, rhino.Client] = {}
    try:
        w2, w3, w4 = workers
        clients["unix"] = rhino.connect(w2.unix_socket, secret=SECRET)
        clients["tcp"] = rhino.connect(w2.address, secret=SECRET, bind_host="127.0.0.5")  # as from another host
        db.put_batch(keys, values, version=0)
        db.checkpoint(store, 0)
        for t, c in clients.items():
            c.open_instance(f"tp-{t}", 0, epoch=1, num_vnodes=NUM_VNODES)
            with c.session(f"tp-{t}", 0, batch=0, epoch=1) as s:
                s.put_batch(keys, values)
                s.commit()

        # ---- throughput: the three ways, back to back in every round ----
        ways = ["in-process", "unix", "tcp"]
        secs = {(op, w): [] for op in ("put", "get", "put+commit") for w in ways}
        got: dict[str, list] = {}
        nxt = {t: 1 for t in clients}  # the next batch of each instance (sessions that abort reuse it)
        for rnd in range(args.repeat):
            # put: the call alone (a session stages it; the in-process call writes it)
            secs[("put", "in-process")].append(_timed(lambda: db_put.put_batch(keys, values, version=1 + rnd)))
            for t, c in clients.items():
                with c.session(f"tp-{t}", 0, batch=nxt[t], epoch=1) as s:  # aborted: the same batch next time
                    secs[("put", t)].append(_timed(lambda: s.put_batch(keys, values)))
            # get
            secs[("get", "in-process")].append(_timed(lambda: got.__setitem__("in-process", db.get_batch(keys))))
            for t, c in clients.items():
                with c.session(f"tp-{t}", 0, batch=nxt[t], epoch=1) as s:
                    secs[("get", t)].append(_timed(lambda: got.__setitem__(t, s.get_batch(keys))))
            # put + commit: one batch made durable as a checkpoint, both ways
            t0 = time.perf_counter()
            db.put_batch(keys, values, version=1 + rnd)
            db.checkpoint(store, 1 + rnd)
            secs[("put+commit", "in-process")].append(time.perf_counter() - t0)
            for t, c in clients.items():
                s = c.session(f"tp-{t}", 0, batch=nxt[t], epoch=1)
                t0 = time.perf_counter()
                s.put_batch(keys, values)
                s.commit()
                secs[("put+commit", t)].append(time.perf_counter() - t0)
                nxt[t] += 1
        expect = values[n - 1].tobytes()
        assert all(g[n - 1] == expect for g in got.values()), "a way read back another value"
        for op in ("put", "get", "put+commit"):
            base = secs[(op, "in-process")]
            for w in ways:
                ratios = [b / x for b, x in zip(base, secs[(op, w)])]
                emit(_throughput_row(op, w, secs[(op, w)], ratios, n, args))
        db.close()
        db_put.close()
        for t, c in clients.items():
            c.close_instance(f"tp-{t}", 0, epoch=1)

        # ---- the fixed cost of a batch: open + commit of 1 key ----
        client = clients["unix"]
        for r, chain in ((0, []), (2, [w3.address, w4.address])):
            op = f"fixed-r{r}"
            client.open_instance(op, 0, epoch=1, num_vnodes=NUM_VNODES, chain=chain, chain_version=1)
            with client.session(op, 0, batch=0, epoch=1) as s:  # a state to checkpoint on top of
                s.put_batch(keys[:10_000], values[:10_000])
                s.commit()
            open_ms, commit_ms, total_ms = [], [], []
            for b in range(1, args.fixed_reps + 1):
                t0 = time.perf_counter()
                s = client.session(op, 0, batch=b, epoch=1)
                t1 = time.perf_counter()
                s.put_batch(keys[b % n: b % n + 1], values[:1])
                t2 = time.perf_counter()
                res = s.commit("barrier")
                t3 = time.perf_counter()
                open_ms.append((t1 - t0) * 1e3)
                commit_ms.append((t3 - t2) * 1e3)
                total_ms.append((t3 - t0) * 1e3)
            row = {"figure": "fixed_cost", "replicas": r, "transport": "unix", "reps": args.fixed_reps,
                   "open_ms_median": round(float(np.median(open_ms)), 3), "open_ms_p90": round(float(np.percentile(open_ms, 90)), 3),
                   "commit_ms_median": round(np.median(commit_ms), 3),
                   "commit_ms_p90": round(float(np.percentile(commit_ms, 90)), 3),
                   "batch_ms_median": round(np.median(total_ms), 3),
                   "last_commit": {k: res.stats.get(k) for k in ("write_s", "checkpoint_s", "replicate_s",
                                                                 "delta_bytes", "delta_files", "files")},
                   "open_target_ms": OPEN_TARGET_MS}
            row["open_target_met"] = row["open_ms_median"] <= OPEN_TARGET_MS
            emit(row)
    finally:
        for d in (db, db_put):
            if not d.closed:
                d.close()
        for c in clients.values():
            c.close()
        for w in workers:
            w.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()

    tp = [r for r in rows if r["figure"] == "throughput"]
    fixed = [r for r in rows if r["figure"] == "fixed_cost"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    ops = ["put", "get", "put+commit"]
    transports = ["in-process", "unix", "tcp"]
    width = 0.26
    for i, t in enumerate(transports):
        ys = [next((r["keys_per_s"] / 1e3 for r in tp if r["op"] == op and r["transport"] == t), 0) for op in ops]
        bars = ax1.bar(np.arange(len(ops)) + (i - 1) * width, ys, width, label=t)
        for b, op in zip(bars, ops):
            r = next((r for r in tp if r["op"] == op and r["transport"] == t), None)
            if r and "ratio_to_inprocess" in r:
                ax1.annotate(f"{r['ratio_to_inprocess']:.0%}", (b.get_x() + b.get_width() / 2, b.get_height()),
                             ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(np.arange(len(ops)), ops)
    ax1.set_ylabel("thousand keys/s (median)")
    n = tp[0]["keys"] if tp else 0
    vb = tp[0]["value_bytes"] if tp else 0
    ax1.set_title(f"{n:,} keys, {vb}-byte values: session vs in-process")
    ax1.legend()
    labels = [f"r={r['replicas']}" for r in fixed]
    ax2.bar(np.arange(len(fixed)) - 0.2, [r["open_ms_median"] for r in fixed], 0.4, label="open session")
    ax2.bar(np.arange(len(fixed)) + 0.2, [r["commit_ms_median"] for r in fixed], 0.4, label="commit 1 key")
    ax2.axhline(OPEN_TARGET_MS, color="gray", ls="--", lw=1, label=f"open target {OPEN_TARGET_MS} ms")
    ax2.set_xticks(np.arange(len(fixed)), labels)
    ax2.set_ylabel("ms (median)")
    ax2.set_yscale("log")
    ax2.set_title("per-batch fixed cost (Unix socket)")
    ax2.legend(fontsize=8)
    save(fig, path)


def report(rows: list[dict], path: str) -> None:
    setup = next(r for r in rows if r["figure"] == "setup")
    lines = ["# State service: sessions against the in-process state backend", "",
             f"Command: `{setup['command']}`, run at {setup['unix']} on {setup['cpus']} CPUs "
             f"(the primary worker, the replicas and the client share them).", "",
             ""]
    tp, fixed = [r for r in rows if r["figure"] == "throughput"], [r for r in rows if r["figure"] == "fixed_cost"]
    lines += md_table(["op", "transport", "keys/s (median)", "ratio to in-process", "target"],
                      [(r["op"], r["transport"], f"{r['keys_per_s']:,}",
                        f"{r['ratio_to_inprocess']:.0%}" if "ratio_to_inprocess" in r else "baseline",
                        f">= {r['target']:.0%}: {'met' if r['target_met'] else 'missed'}" if "target" in r else "")
                       for r in tp], "llrrl")
    lines += [""] + md_table(["replicas", "open session, ms (median / p90)", "commit 1 key, ms (median / p90)",
                              "target"],
                             [(r["replicas"], f"{r['open_ms_median']} / {r['open_ms_p90']}",
                               f"{r['commit_ms_median']} / {r['commit_ms_p90']}",
                               f"open <= {r['open_target_ms']} ms: {'met' if r['open_target_met'] else 'missed'}")
                              for r in fixed], "rrrl")
    write_lines(path, lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rhino-bench service",
                                description="Sessions over the Unix socket and TCP against in-process StateBackend.")
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--repeat", type=int, default=15, help="rounds per throughput figure (median)")
    p.add_argument("--fixed-reps", type=int, default=50, help="batches per fixed-cost figure")
    io_flags(p, dir=".bench-service", flags=("keep", "json", "out", "plot", "report"), keep="keep the work directory",
             report="write a Markdown table here")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    args = p.parse_args(argv)
    args.argv = argv
    for name in ("keys", "value_bytes", "repeat", "fixed_reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    exit_on_sigterm()
    with JsonLines(args, echo=lambda row: "  ".join(f"{k}={v}" for k, v in row.items() if k != "command")) as lines:
        run(args, lines.emit)
    if args.plot:
        plot(lines.rows, args.plot)
    if args.report:
        report(lines.rows, args.report)
    return 0

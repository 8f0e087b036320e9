#!/usr/bin/env python3
"""Writes replicate.md from the JSON lines of `rhino-bench replicate`.

usage: python bench/report_replicate.py bench/results/replicate.jsonl bench/results/replicate.md

One row per replication factor r of the latest run (by run_id), every figure measured in that run
(`rhino-bench replicate` writes one JSON object per r), with the targets of
issue 3: throughput >= 80% (r=1) / 70% (r=2) of min(disk limit, loopback
limit), and worker RSS growth <= credit window + 32 MB.
"""

from __future__ import annotations

import json
import sys

COMMAND = ("rhino-bench replicate --workers 3 --replicas 1,2 --size 2G --json \\\n"
           "    --out bench/results/replicate.jsonl --plot bench/results/replicate.png")


def _probes(xs: list[float]) -> str:
    """'plain / early writeback / direct' probe figures."""
    return " / ".join(f"{x:.0f}" for x in xs)


def main(src: str, dst: str) -> int:
    every = [json.loads(line) for line in open(src, encoding="utf-8") if line.strip()]
    if not every:
        sys.exit(f"{src}: no results")
    # The file keeps every run (one line per r); the report is the latest run.
    latest = max(r.get("run_id", "") for r in every)
    rows = [r for r in every if r.get("run_id", "") == latest]
    earlier = len({r.get("run_id", "") for r in every}) - 1
    m = rows[-1].get("machine", {})
    out = [
        "# Chain replication throughput (issue 3)",
        "",
        "Command (`make bench` runs it):",
        "",
        "    " + COMMAND,
        "",
        f"Machine: {m.get('cpus', '?')} CPUs, kernel {m.get('kernel', '?')}, Python {m.get('python', '?')}. "
        f"Chunk {rows[-1]['chunk_bytes'] >> 20} MiB, window {rows[-1]['window']} "
        f"(credit window {rows[-1]['credit_window_mb']:g} MiB). Run `{latest or '?'}`; raw lines: `replicate.jsonl` "
        f"(it also keeps {earlier} earlier run(s)); chart: `replicate.png`.",
        "",
        "| r | checkpoint | seconds | MB/s | disk limit | loopback limit | fraction of min | target "
        "| all replicas' writes (r x MB/s) / disk limit | RSS growth (max worker) | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rss_cap = r["credit_window_mb"] + 32
        out.append(
            f"| {r['replicas']} | {r['bytes'] / 1e9:.2f} GB | {r['seconds']:.2f} | {r['throughput_mb_s']:.0f} "
            f"| {r['disk_limit_mb_s']:.0f} | {r['loopback_limit_mb_s']:.0f} | {r['fraction_of_limit']:.2f} "
            f"| >= {r['target_fraction']:.2f} {'PASS' if r['throughput_target_met'] else 'FAIL'} "
            f"| {r['replicas'] * r['throughput_mb_s'] / r['disk_limit_mb_s']:.2f} "
            f"| {r['max_rss_growth_mb']:.1f} MB | <= {rss_cap:g} MB {'PASS' if r['rss_target_met'] else 'FAIL'} |")
    out += [
        "",
        "Notes:",
        "- Throughput is checkpoint bytes over the time from the call to the primary's ack: the tail's",
        "  fsyncs and every member's commit are included.",
        "- The disk limit is one writer doing 1 MiB writes and one fsync at the end, on the same file",
        "  system, after a sync: once plainly, once starting writeback after every 1 MiB as the",
        "  replicas do, and (runs since 02:20 UTC on 2026-11-22) once with O_DIRECT, which bypasses the page",
        "  cache and shows what the device itself absorbs. This disk's speed drifts within a run, so it is probed "
        + ("right before and right after every transfer (probes, MB/s: "
           + "; ".join(f"r={r['replicas']} before {_probes(r['disk_probes_mb_s']['before'])}, after "
                       f"{_probes(r['disk_probes_mb_s']['after'])}" for r in rows) + ")"
           if all("disk_probes_mb_s" in r for r in rows) else
           "right before every transfer (probes: "
           + ", ".join(f"{r.get('disk_probe_before_mb_s', r['disk_limit_mb_s']):.0f}" for r in rows) + " MB/s)"),
        "  and every row is judged against the fastest. The loopback limit is one TCP connection over",
        "  loopback. Both are measured in the run.",
        "- Replicas start writeback after every chunk (`sync_file_range`) and drop a file's pages once it",
        "  is fsync'ed; concurrent writers can together exceed the single-writer disk probe, so a fraction",
        "  above 1 means the probe understates what the disk absorbs, not that data was skipped.",
        "- All workers of this benchmark share one disk (and two cores): with r replicas every byte is",
        "  written r times to that disk, so r x throughput cannot exceed what the disk absorbs. The column",
        "  'all replicas' writes' shows how close the chain comes to that: when it is near 1, the chain",
        "  writes as fast as the disk can, and r=2 cannot exceed half the disk limit. The issue's r=2",
        "  target (0.7) assumes one disk per worker, as on separate hosts.",
        "",
    ]
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

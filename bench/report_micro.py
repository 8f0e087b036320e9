#!/usr/bin/env python3
"""Turns pytest-benchmark's JSON into bench/results/micro.md.

usage: python bench/report_micro.py bench/results/micro.json [OUT.md]

For each figure (a pair of benchmarks with the same extra_info["figure"], or a
Rhino benchmark naming another figure's baseline in extra_info["baseline_figure"]) the
table gives Rhino's figure, its baseline's, the ratio, the target from issue 2
and PASS/FAIL; then the interleaved pairs of put/get (test_state_paired.py:
the median of per-pair ratios, wall-clock and CPU); then every benchmark's raw
statistics, the exact command, the
parameters and the machine.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository, for rhino._machine

from rhino_bench.report import md_table  # noqa: E402

# figure -> (how to compare, min ratio, min Rhino rate, target text)
TARGETS: dict[str, dict[str, Any]] = {
    "routing": {"compare": "rate", "min_ratio": 100.0, "min_rate": 100e6,
                "text": ">= 100 M keys/s on one core and >= 100x the pure-Python partitioner"},
    "batched put": {"compare": "rate", "min_ratio": 3.0, "text": ">= 3x rocksdict per-key puts"},
    "batched get": {"compare": "rate", "min_ratio": 3.0, "text": ">= 3x rocksdict per-key gets"},
    "batched get, list of bytes": {"compare": "rate", "min_ratio": 3.0, "text": ">= 3x rocksdict per-key gets"},
    "batched get, Arrow binary out": {"compare": "rate", "min_ratio": 3.0, "text": ">= 3x rocksdict per-key gets"},
    "batched put, Arrow binary in": {"compare": "rate", "min_ratio": 3.0, "text": ">= 3x rocksdict per-key puts"},
    **{f"batched get in batches of {b} keys": {
        "compare": "rate", "info": True,
        "text": "none (informational): one MultiGet per vnode a batch touches"} for b in ("100", "1,000", "10,000")},
    "restore 64 MiB": {"compare": "time", "text": "none here (informational); targets: restore sweep"},
}


def _rate(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:,.1f} M {unit}/s"
    if x >= 1e3:
        return f"{x / 1e3:,.0f} k {unit}/s"
    return f"{x:,.0f} {unit}/s"


def _secs(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.2f} s"


def _machine_lines(m: dict[str, Any]) -> list[str]:
    fs = m.get("filesystem") or {}
    return [
        f"- CPU: {m.get('cpu_model')} ({m.get('cpu_cores')} cores, {m.get('cpu_cores_usable')} usable)",
        f"- RAM: {m.get('ram_bytes', 0) / (1 << 30):.1f} GiB",
        f"- OS / kernel: {m.get('os')} / {m.get('kernel')}",
        f"- Disk filesystem: {fs.get('fstype')} on {fs.get('device')} (mounted at {fs.get('mount')})",
        f"- Python {m.get('python')}, rhino {m.get('rhino')}, RocksDB {m.get('rocksdb') or m.get('librocksdb')}",
        f"- Load average (1, 5, 15 min): {m.get('loadavg_at_start', '?')} when the run started, "
        f"{m.get('loadavg_1_5_15')} when it ended (other processes share these cores)",
    ]


def build_report(data: dict[str, Any], json_path: str) -> tuple[str, bool]:
    benches = data["benchmarks"]
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    for b in benches:
        info = b.get("extra_info", {})
        if "figure" in info:
            figures.setdefault(info["figure"], {})[info["role"]] = b

    lines = ["# Micro-benchmarks", "",
             f"Run {data.get('datetime', '?')}; every pair below was measured in this one run. "
             "Figures are medians over the rounds (wall-clock).", "",
             "| figure | Rhino | baseline | ratio | target | result |",
             "|---|---|---|---|---|---|"]
    all_pass = True
    order = [f for f in TARGETS if f in figures] + [f for f in figures if f not in TARGETS]
    figures = {f: figures[f] for f in order}
    for name, pair in figures.items():
        rh, base = pair.get("rhino"), pair.get("baseline")
        if rh is not None and base is None and "baseline_figure" in rh["extra_info"]:
            base = figures.get(rh["extra_info"]["baseline_figure"], {}).get("baseline")  # a shared baseline
        if rh is None or base is None:
            continue
        t = TARGETS.get(name, {"compare": "rate", "text": "-"})
        ri, bi = rh["extra_info"], base["extra_info"]
        if t["compare"] == "rate":
            r_rate = ri["items"] / rh["stats"]["median"]
            b_rate = bi["items"] / base["stats"]["median"]
            ratio = r_rate / b_rate
            r_txt, b_txt = _rate(r_rate, ri["unit"]), _rate(b_rate, bi["unit"])
            ok = ratio >= t.get("min_ratio", 0) and r_rate >= t.get("min_rate", 0)
            if t.get("info"):
                result = "info"
            else:
                result = "PASS" if ok else "FAIL"
                all_pass &= ok
            ratio_txt = f"{ratio:,.1f}x"
        else:
            r_s, b_s = rh["stats"]["median"], base["stats"]["median"]
            r_txt = f"{_secs(r_s)} ({ri['items']} files)"
            b_txt = f"{_secs(b_s)} ({bi['items']} files)"
            ratio_txt = f"{b_s / r_s:,.1f}x faster"
            result = "info"
        lines.append(f"| {name} | {r_txt} | {b_txt} | {ratio_txt} | {t['text']} | {result} |")

    paired = [b for b in benches if "paired_figure" in b.get("extra_info", {})]
    if paired:
        lines += ["", "Interleaved pairs (`bench/micro/test_state_paired.py`): one Rhino call and one rocksdict "
                  "call back to back, in ABBA order, repeated; the ratio of each pair, so load that drifts "
                  "during the run hits both sides of a pair alike. Wall-clock and thread-CPU ratios:", "",
                  "| figure | pairs | wall-clock ratio: median (min-max) | CPU ratio: median (min-max) | target "
                  "| result (median wall-clock ratio) |",
                  "|---|---|---|---|---|---|"]
        for b in paired:
            i = b["extra_info"]
            t = TARGETS.get(i["paired_figure"], {"text": "-"})
            ok = i["ratio_wall_median"] >= t.get("min_ratio", 0)
            all_pass &= ok
            lines.append(f"| {i['paired_figure']} | {i['pairs']} | {i['ratio_wall_median']:.1f}x "
                         f"({i['ratio_wall_min']:.1f}-{i['ratio_wall_max']:.1f}) | {i['ratio_cpu_median']:.1f}x "
                         f"({i['ratio_cpu_min']:.1f}-{i['ratio_cpu_max']:.1f}) | {t['text']} | "
                         f"{'PASS' if ok else 'FAIL'} |")

    lines += ["", "CPU-time rates (thread CPU time of one extra call; the rate per busy core even when "
              "other processes share the machine):", ""]
    for name, pair in figures.items():
        for role in ("rhino", "baseline"):
            b = pair.get(role)
            if b and b["extra_info"].get("cpu_items_per_s"):
                lines.append(f"- {name}, {role}: {_rate(b['extra_info']['cpu_items_per_s'], b['extra_info']['unit'])}")

    lines += ["", "## Every benchmark", ""]
    lines += md_table(["benchmark", "what", "rounds", "min", "median", "max", "items per call", "rate (median)"],
                      [(f"`{b['name']}`", i.get("what", ""), s["rounds"], _secs(s["min"]), _secs(s["median"]),
                        _secs(s["max"]), f"{i.get('items', '')} {i.get('unit', '')}",
                        _rate(i["items"] / s["median"] if i.get("items") else None, i.get("unit", "items")))
                       for b in benches for s, i in [(b["stats"], b.get("extra_info", {}))]
                       if "paired_figure" not in i])  # the pairs are in the table above

    mi = data.get("machine_info", {})
    command = mi.get("rhino_command", "python -m pytest bench/micro --benchmark-only")
    lines += ["", "## Command", "",
              "```",
              "make bench   # runs, among others:",
              command,
              f"python bench/report_micro.py {os.path.relpath(json_path)}",
              "```", "",
              "Parameters: routing 10,000,000 random int64 keys (baseline 200,000), K = 2^15, V = 256; "
              "put/get 100,000 random int64 keys with 100-byte random values, V = 256 vnodes, rocksdict in "
              "raw mode with default options; restore of a 64 MiB state (1 KiB values) with a warm page "
              "cache. Sources: `bench/micro/`.", "",
              "## Machine", ""]
    m = mi.get("rhino_machine")
    lines += _machine_lines(m) if m else [f"- {mi.get('cpu', {}).get('brand_raw', '?')}, {mi.get('release', '?')}"]
    commit = data.get("commit_info", {})
    if commit.get("id"):
        lines.append(f"- Commit: {commit['id'][:12]}{' (with uncommitted changes)' if commit.get('dirty') else ''}")
    return "\n".join(lines) + "\n", all_pass


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    json_path = argv[1]
    out = argv[2] if len(argv) == 3 else os.path.splitext(json_path)[0] + ".md"
    with open(json_path, encoding="utf-8") as f:
        data = json.load(f)
    text, all_pass = build_report(data, json_path)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print(f"wrote {out}; targets {'all met' if all_pass else 'NOT all met'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

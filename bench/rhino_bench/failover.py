"""`rhino-bench failover`: recovery after a worker is SIGKILLed, by takeover
with hard links (Rhino) against a DFS-style full fetch, per state size
(Rhino paper §5.2.1, Table 1: scheduling, state fetching, state loading).

    rhino-bench failover --sizes 1G,2G,4G --json --out bench/results/failover.jsonl         --plot bench/results/failover.png --report bench/results/failover.md

How it runs and what each record holds: bench/README.md, "Failover".
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from rhino._machine import describe_machine
from rhino._sizes import format_bytes
from rhino.client.client import Client, connect
from rhino.engine import BatchDriver
from rhino.errors import RhinoError
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret
from rhino_testing.workload import keys_for, random_values

from .common import JsonLines, exit_on_sigterm, io_flags
from .failover_control import CONTROLS, OPERATOR, BenchError, heartbeat_available
from .failover_report import FETCH_FLAT_TARGET, SPEEDUP_TARGET, combine, plot, report, summarize
from .report import size_arg, sizes_arg

__all__ = ["run", "main", "summarize", "FETCH_FLAT_TARGET", "SPEEDUP_TARGET"]

SAMPLE_PER_BATCH = 64


# ---- one size ----------------------------------------------------------------------------------


def _received(workers: list[WorkerProcess]) -> int:
    """Chunk bytes the live workers have received from a predecessor (replication, bulk copies)."""
    total = 0
    for w in workers:
        if w.alive():
            total += int(w.metric("rhino_worker_bytes_received_total"))
    return total


def _cached_fraction(store: Path) -> Optional[float]:
    """The fraction of a replica store's pooled bytes resident in the page cache (util-linux fincore),
    None where it cannot be read."""
    files = [str(f) for f in (store / "pool").rglob("*") if f.is_file()]
    if not files or shutil.which("fincore") is None:
        return None
    res = size = 0
    for i in range(0, len(files), 200):
        p = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", *files[i:i + 200]],
                           capture_output=True, text=True)
        if p.returncode != 0:
            return None
        for line in p.stdout.splitlines():
            r, z = line.split()[:2]
            res, size = res + int(r), size + int(z)
    return round(res / size, 3) if size else None


def _check_sample(client: Client, epoch: int, batch: int, sample: dict[int, bytes]) -> dict:
    keys = np.fromiter(sample.keys(), dtype=np.int64, count=len(sample))
    with client.session(OPERATOR, 0, batch=batch, epoch=epoch) as s:
        got = s.get_batch(keys)
        s.abort()
    bad = sum(1 for k, v in zip(keys.tolist(), got) if v != sample[k])
    return {"ok": bad == 0, "keys_checked": len(keys), "wrong": bad}


@dataclass
class _Filled:
    """What the fill left: checkpoint ``checkpoint`` of A's instance, and a sample of what was written."""

    checkpoint: int
    n_total: int
    sample: dict[int, bytes]
    files_after_load: int
    fill_s: float
    settle_s: float


def measure_size(size: int, args: argparse.Namespace, say: Callable[[str], None], rep: int = 0) -> list[dict]:
    """One trial at one size: a fresh cluster, filled, A killed, both recoveries measured."""
    root = Path(args.dir) / f"size-{size}-{rep}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    secret_file = write_secret(root, SECRET)
    control: Any = None
    workers: list[WorkerProcess] = []
    clients: list[Client] = []
    try:
        control = CONTROLS[args.detection](root, secret_file, args)
        a, b, c, d = (WorkerProcess(root, f"w{n}", f"127.0.0.{n}", secret_file=secret_file, metrics=True,
                                    extra_args=control.worker_args() if n != 5 else []) for n in (2, 3, 4, 5))
        for w in (a, b, c, d):
            workers.append(w.start())
        control.join([a, b, c])  # D holds nothing and is not the coordinator's: the DFS baseline's reader
        epoch0 = _place(control.client, a, b, c, args)
        filled = _fill(control.client, a, b, c, size, args, rep, epoch0, clients, say)
        quiesce_s = _quiesce(control, args)
        rhino = _rhino_failover(control, a, b, c, d, args, filled, clients)
        dfs = _dfs_fetch(d, rhino, filled, clients)
        return _rows(size, args, rep, control, a, filled, quiesce_s, rhino, dfs)
    finally:
        for cl in clients:
            cl.close()
        if control is not None:
            control.close()
        for w in workers:
            w.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def _place(cc: Any, a: WorkerProcess, b: WorkerProcess, c: WorkerProcess, args: argparse.Namespace) -> int:
    """Creates the operator (one instance, r=2): primary A, chain B and C. Returns its epoch."""
    cc.create_operator(OPERATOR, parallelism=1, num_vnodes=args.num_vnodes, replicas=2)
    pl = cc.placement(OPERATOR)
    inst = pl.instances[0]
    if inst.primary != a.id or sorted(inst.chain) != sorted([b.id, c.id]):
        raise BenchError(f"unexpected placement: primary {inst.primary}, chain {list(inst.chain)}")
    return pl.epoch


def _fill(cc: Any, a: WorkerProcess, b: WorkerProcess, c: WorkerProcess, size: int, args: argparse.Namespace,
          rep: int, epoch0: int, clients: list[Client], say: Callable[[str], None]) -> _Filled:
    """1. The state, through sessions on A, committed in barrier mode (so replicated to B and C); then
    tiny batches until the checkpoint's file count stops falling (compaction settled)."""
    from rhino.cli.progress import Progress

    primary = connect(str(a.unix_socket), secret=SECRET, client_id="bench-writer", request_timeout=3600.0)
    clients.append(primary)
    v = args.value_bytes
    n_total = max(1, size // v)
    per = max(1, args.fill_batch_bytes // v)
    gen = np.random.default_rng([args.seed, rep])
    pick = np.random.default_rng([args.seed, rep, 1])
    sample: dict[int, bytes] = {}
    batch = 0
    last: Any = None
    t0 = time.monotonic()
    with Progress(f"{format_bytes(size)}: filling A (r=2)", n_total * v, enabled=not args.quiet) as bar:
        for first in range(0, n_total, per):
            n = min(per, n_total - first)
            keys = keys_for(first, n)
            values = random_values(gen, n, v)
            for j in pick.choice(n, size=min(n, SAMPLE_PER_BATCH), replace=False).tolist():
                sample[int(keys[j])] = values[j].tobytes()
            last = _commit(cc, primary, batch, keys, values, epoch0)
            batch += 1
            bar.advance(n * v)
            del keys, values
    fill_s = time.monotonic() - t0
    files_after_load = int(last.stats.get("files", 0))
    t1 = time.monotonic()
    files = [files_after_load]
    quiet = 0
    while time.monotonic() - t1 < args.settle_timeout and quiet < 3:
        time.sleep(1.0)
        k = keys_for(n_total + batch, 1)
        last = _commit(cc, primary, batch, k, random_values(gen, 1, v), epoch0)
        batch += 1
        files.append(int(last.stats.get("files", 0)))
        quiet = quiet + 1 if files[-1] >= min(files[:-1]) - 1 else 0
    settle_s = time.monotonic() - t1
    alive = {w["id"] for w in cc.status()["workers"] if w["state"] == "alive"}
    pl = cc.placement(OPERATOR)
    if pl.epoch != epoch0 or pl.instances[0].primary != a.id or not {a.id, b.id, c.id} <= alive:
        raise BenchError("the coordinator reconfigured the operator while it was being filled: epoch "
                         f"{pl.epoch}, workers alive {sorted(alive)}" + _FALSE_DEATH)
    primary.close()
    say(f"{format_bytes(size)}: {last.stats.get('checkpoint_bytes', 0) / 1e9:.2f} GB in checkpoint {batch - 1} "
        f"({files[-1]} files; {files_after_load} right after the load), fill {fill_s:.0f} s, "
        f"settle {settle_s:.0f} s")
    return _Filled(checkpoint=batch - 1, n_total=n_total, sample=sample, files_after_load=files_after_load,
                   fill_s=fill_s, settle_s=settle_s)


def _quiesce(control: Any, args: argparse.Namespace) -> float:
    """The fill's dirty pages written back, so they do not land on the failover's fsyncs; then the
    failure detector armed. Returns the seconds it took before arming."""
    t2 = time.monotonic()
    os.sync()
    time.sleep(args.quiesce)
    quiesce_s = time.monotonic() - t2
    control.arm()
    time.sleep(2 * args.heartbeat_timeout if control.mode != "none" else 0)
    if any(w["state"] != "alive" for w in control.client.status()["workers"]):
        raise BenchError(f"a worker was declared dead before the kill: {control.client.status()['workers']}")
    return quiesce_s


def _rhino_failover(control: Any, a: WorkerProcess, b: WorkerProcess, c: WorkerProcess, d: WorkerProcess,
                    args: argparse.Namespace, filled: _Filled, clients: list[Client]) -> dict:
    """2 + 3. SIGKILL A; the coordinator fails the instance over to a chain member by hard links."""
    cc = control.client
    cached = {w.id: _cached_fraction(w.dir) for w in (b, c)}
    net0 = _received([b, c, d])
    kill_unix = time.time()
    a.kill()
    fo = control.failover(a, kill_unix, timeout=args.heartbeat_timeout + 600)
    network_bytes = _received([b, c, d]) - net0
    tk = fo["takeover"]
    if tk["worker"] not in (b.id, c.id):
        raise BenchError(f"the instance went to {tk['worker']}, not a chain member")
    new_primary, survivor = (b, c) if tk["worker"] == b.id else (c, b)
    if "sent_unix" in tk:
        scheduling = tk["sent_unix"] - fo["dead_since"]
    else:  # an older coordinator: its whole failover less the takeover request
        scheduling = fo["recovery_s"] - tk["request_s"]
    pl = cc.placement(OPERATOR)
    cl_new = connect(new_primary.address, secret=SECRET, client_id="bench-check", request_timeout=600.0)
    clients.append(cl_new)
    return {"fo": fo, "takeover": tk, "restore": tk["restore"], "cached": cached, "network_bytes": network_bytes,
            "new_primary": new_primary, "survivor": survivor, "scheduling": scheduling,
            "detection": fo["dead_since"] - kill_unix if fo["detected"] else None,
            "epoch": pl.epoch, "chain_version": pl.instances[0].chain_version,
            "check": _check_sample(cl_new, pl.epoch, filled.checkpoint + 1, filled.sample)}


def _dfs_fetch(d: WorkerProcess, rhino: dict, filled: _Filled, clients: list[Client]) -> dict:
    """4. DFS-style: D pulls a full copy of the checkpoint from the survivor, then opens it."""
    survivor, epoch = rhino["survivor"], rhino["epoch"]
    d0 = _received([d])
    cl_src = connect(survivor.address, secret=SECRET, client_id="bench-dfs", request_timeout=3600.0)
    clients.append(cl_src)
    tw = time.monotonic()
    copy = cl_src.replicate(OPERATOR, 0, epoch=epoch, to=[d.address], chain_version=rhino["chain_version"],
                            checkpoint=filled.checkpoint, timeout=3600.0)
    copy_wall = time.monotonic() - tw
    received = _received([d]) - d0
    cl_d = connect(d.address, secret=SECRET, client_id="bench-dfs", request_timeout=3600.0)
    clients.append(cl_d)
    info_d = cl_d.takeover(OPERATOR, 0, epoch=epoch + 1, checkpoint=filled.checkpoint, chain=[],
                           chain_version=rhino["chain_version"])
    return {"copy": copy, "copy_wall": copy_wall, "received": received, "restore": info_d["restore"],
            "worker": f"{d.id} ({d.host})",
            "check": _check_sample(cl_d, epoch + 1, filled.checkpoint + 1, filled.sample)}


def _rows(size: int, args: argparse.Namespace, rep: int, control: Any, a: WorkerProcess, filled: _Filled,
          quiesce_s: float, rhino: dict, dfs: dict) -> list[dict]:
    """The trial's two records (Rhino, DFS-style); raises if either read back other values."""
    rs, rd, copy = rhino["restore"], dfs["restore"], dfs["copy"]
    detection, scheduling = rhino["detection"], rhino["scheduling"]
    new_primary, survivor = rhino["new_primary"], rhino["survivor"]
    common = {
        "size_bytes": size, "state_bytes": int(rs["total_bytes"]), "checkpoint": filled.checkpoint,
        "keys": filled.n_total, "value_bytes": args.value_bytes, "num_vnodes": args.num_vnodes, "replicas": 2,
        "fill_batch_bytes": args.fill_batch_bytes, "fill_s": round(filled.fill_s, 2),
        "settle_s": round(filled.settle_s, 2), "quiesce_s": round(quiesce_s, 2),
        "files_after_load": filled.files_after_load, "detection_mode": control.mode,
        "heartbeat_timeout_s": args.heartbeat_timeout if control.mode != "none" else None,
        "heartbeat_interval_s": args.heartbeat_interval if control.mode != "none" else None,
        "coordinator": {"heartbeat": "served from the bench process (rhino.coordinator.server.CoordinatorServer)",
                        "process": "a rhino coordinator process", "none": "in-process, told at once"}[control.mode],
        "killed": f"{a.id} ({a.host})", "detection_s": None if detection is None else round(detection, 4),
        "scheduling_s": round(scheduling, 4), "recovery_s": round(rhino["fo"]["recovery_s"], 4),
    }
    excl_r = scheduling + rs["build_s"] + rs["open_s"]
    check_rhino, check_dfs = rhino["check"], dfs["check"]
    rhino_row = {
        "record": "trial", "rep": rep, **common, "method": "rhino", "fetch_s": round(rs["build_s"], 4),
        "load_s": round(rs["open_s"], 4),
        "total_s": None if detection is None else round(detection + excl_r, 4),
        "total_excl_detection_s": round(excl_r, 4), "worker": f"{new_primary.id} ({new_primary.host})",
        "files": rs["files"], "linked_files": rs["linked_files"], "copied_files": rs["copied_files"],
        "copied_bytes": rs["copied_bytes"], "network_bytes": rhino["network_bytes"],
        "takeover_request_s": round(rhino["takeover"]["request_s"], 4), "restore_s": rhino["takeover"].get("restore_s"),
        "store_cached_fraction": rhino["cached"][new_primary.id],
        "state_correct": check_rhino["ok"], "keys_checked": check_rhino["keys_checked"],
    }
    fetch_d = copy["seconds"] + rd["build_s"]
    excl_d = scheduling + fetch_d + rd["open_s"]
    dfs_row = {
        "record": "trial", "rep": rep, **common, "method": "dfs", "fetch_s": round(fetch_d, 4),
        "load_s": round(rd["open_s"], 4),
        "total_s": None if detection is None else round(detection + excl_d, 4),
        "total_excl_detection_s": round(excl_d, 4), "worker": dfs["worker"],
        "source": f"{survivor.id} ({survivor.host})", "copy_s": round(copy["seconds"], 4),
        "copy_wall_s": round(dfs["copy_wall"], 4), "link_build_s": round(rd["build_s"], 4),
        "copy_mb_s": round(copy["bytes_sent"] / copy["seconds"] / 1e6, 1) if copy["seconds"] > 0 else None,
        "files": rd["files"], "linked_files": rd["linked_files"], "copied_files": rd["copied_files"],
        "copied_bytes": rd["copied_bytes"], "network_bytes": int(copy["bytes_sent"]),
        "received_bytes": dfs["received"], "source_cached_fraction": rhino["cached"][survivor.id],
        "state_correct": check_dfs["ok"], "keys_checked": check_dfs["keys_checked"],
    }
    for r, chk in ((rhino_row, check_rhino), (dfs_row, check_dfs)):
        if not chk["ok"]:
            raise BenchError(f"{r['method']}: {chk['wrong']} of {chk['keys_checked']} sampled keys read back "
                             f"other values than were written")
    return [rhino_row, dfs_row]


_FALSE_DEATH = ("; the primary was declared dead by heartbeat timeout while it committed (a build before 5231c24 "
                "sends no heartbeat while a commit holds the instance: Worker.metrics() kept the GIL while it waited "
                "for the instance's mutex): use --detection heartbeat, a longer --heartbeat-timeout or smaller "
                "--fill-batch-bytes")


def _commit(cc: Any, client: Client, batch: int, keys: np.ndarray, values: np.ndarray, epoch: int) -> Any:
    """One batch of the fill, through the engine's begin and commit, on the primary's Unix
    socket; no rerun: a reconfiguration during the fill spoils the trial."""
    driver = BatchDriver(cc, OPERATOR)
    pl = driver.begin(batch)
    if pl.epoch != epoch:
        raise BenchError(f"the operator moved to epoch {pl.epoch} while it was being filled" + _FALSE_DEATH)
    try:
        with client.session(OPERATOR, 0, batch=batch, epoch=epoch) as s:
            s.put_batch(keys, values)
            res = s.commit("barrier")
    except RhinoError as e:
        st = cc.status()
        if any(e2["kind"] == "worker_dead" for e2 in st["events"]) or cc.placement(OPERATOR).epoch != epoch:
            raise BenchError(f"batch {batch} failed ({type(e).__name__}: {e})" + _FALSE_DEATH) from None
        raise
    driver.commit(batch, epoch=epoch, instances={"0": {"checkpoint_bytes": int(res.stats.get("checkpoint_bytes", 0))}})
    return res


# ---- the run -------------------------------------------------------------------------------------

def run(args: argparse.Namespace, emit: Callable[[dict], None], say: Callable[[str], None]) -> list[dict]:
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    emit({"record": "setup", "command": args.command, "sizes": args.sizes, "detection": args.detection,
          "detection_note": args.detection_note,
          "heartbeat_timeout_s": args.heartbeat_timeout, "heartbeat_interval_s": args.heartbeat_interval,
          "value_bytes": args.value_bytes, "fill_batch_bytes": args.fill_batch_bytes, "num_vnodes": args.num_vnodes,
          "settle_timeout_s": args.settle_timeout, "quiesce_s": args.quiesce, "repeat": args.repeat,
          "workers": {"A": "127.0.0.2", "B": "127.0.0.3", "C": "127.0.0.4", "D": "127.0.0.5"},
          "page_cache_dropped": False, "machine": describe_machine(args.dir),
          "unix": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    rows: list[dict] = []
    for size in args.sizes:
        free = shutil.disk_usage(args.dir).free
        need = 8 * size + (1 << 30)
        if free < need:
            row = {"record": "skipped", "size_bytes": size, "reason": f"{format_bytes(free)} free under {args.dir}, "
                                                                      f"this size needs about {format_bytes(need)}"}
            emit(row)
            say(f"{format_bytes(size)}: skipped: {row['reason']}")
            continue
        trials: list[dict] = []
        for rep in range(args.repeat):
            for r in measure_size(size, args, say, rep):
                trials.append(r)
                emit(r)
                say(f"{format_bytes(size)} #{rep} {r['method']:5s}: detection {r['detection_s']} s, scheduling "
                    f"{r['scheduling_s']:.3f} s, fetch {r['fetch_s']:.3f} s, load {r['load_s']:.3f} s, total excl. "
                    f"detection {r['total_excl_detection_s']:.3f} s ({r['linked_files']} of {r['files']} files "
                    f"linked, {format_bytes(r['network_bytes'])} over the network)")
        for method in ("rhino", "dfs"):
            r = combine([t for t in trials if t["method"] == method])
            rows.append(r)
            emit(r)
    summary = summarize(rows)
    emit(summary)
    if not args.keep:
        try:
            os.rmdir(args.dir)  # only if empty: each run removed its own directories
        except OSError:
            pass
    return rows + [summary]


# ---- the command ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rhino-bench failover",
                                description="Recovery after a SIGKILL, per state size: takeover by hard links "
                                            "(Rhino) against a DFS-style full fetch (Rhino paper Table 1).")
    p.add_argument("--sizes", type=sizes_arg, required=True, help="comma-separated state sizes, e.g. 1G,2G,4G")
    p.add_argument("--detection", choices=["auto", *sorted(CONTROLS)], default="auto",
                   help="process: workers heartbeating (rhino worker --coordinator) to a rhino coordinator "
                        "process with --heartbeat-timeout; heartbeat: to the coordinator served from this process, "
                        "the timeout armed after the fill; none: an in-process coordinator told at once, detection "
                        "not measured; auto (default): process when this build can, else none")
    p.add_argument("--heartbeat-timeout", type=float, default=1.0,
                   help="the coordinator's --heartbeat-timeout in seconds (default: %(default)s)")
    p.add_argument("--heartbeat-interval", type=float, default=0.2,
                   help="the workers' --coordinator-heartbeat in seconds (default: %(default)s)")
    p.add_argument("--value-bytes", type=int, default=4096, help="bytes per value (default: %(default)s)")
    p.add_argument("--fill-batch-bytes", type=size_arg, default=size_arg("512M"),
                   help="bytes per committed batch while filling (default: 512M; at most the workers' "
                        "--max-session-bytes, 1G)")
    p.add_argument("--num-vnodes", type=int, default=64, help="vnodes of the instance (default: %(default)s)")
    p.add_argument("--settle-timeout", type=float, default=60.0,
                   help="seconds to wait for compactions after the fill (default: %(default)s)")
    p.add_argument("--quiesce", type=float, default=2.0,
                   help="seconds to wait after a sync before the kill (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=1,
                   help="trials per size, each on a fresh cluster; rows give the medians (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    io_flags(p, dir=".bench-failover", keep="keep each size's directories", plot="write the stacked bars here (PNG)",
             report="write the Markdown table here")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    args = p.parse_args(argv)
    args.command = "rhino-bench failover " + " ".join(argv)
    if args.value_bytes < 1 or args.num_vnodes < 1 or args.repeat < 1:
        p.error("--value-bytes, --num-vnodes and --repeat must be at least 1")
    if args.quiesce < 0 or args.settle_timeout < 0:
        p.error("--quiesce and --settle-timeout must be at least 0")
    if not args.heartbeat_timeout > 0 or not 0 < args.heartbeat_interval <= 60:
        p.error("--heartbeat-timeout must be positive and --heartbeat-interval in (0, 60]")
    if args.fill_batch_bytes > (960 << 20):
        p.error("--fill-batch-bytes must be at most 960M (a session holds at most 1 GiB)")
    exit_on_sigterm()
    with JsonLines(args) as lines:
        why = heartbeat_available()
        args.detection_note = None
        if args.detection == "auto":
            args.detection = "none" if why else "process"
            if why:
                args.detection_note = f"detection not measured: {why}"
                lines.say(f"rhino-bench failover: {args.detection_note}")
        elif args.detection != "none" and why:
            p.error(f"--detection {args.detection}: {why}")
        try:
            run(args, lines.emit, lines.say)
        except BenchError as e:
            print(f"rhino-bench failover: {e}", file=sys.stderr)
            return 1
    if args.plot:
        plot(lines.rows, args.plot)
    if args.report:
        report(lines.rows, args.report)
    return 0

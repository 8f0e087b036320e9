"""`rhino inspect`: what is in a state directory or a replica store.

A path is recognized as
  * live state: a RocksDB directory (has CURRENT), opened read-only, so this
    works while another process has the state open;
  * a replica store: has pool/ and checkpoints/;
  * a directory holding both as live/ and store/ (what `rhino-bench demo --data-plane` creates).
The result is a plain dict (printed as JSON with --json) and format_report()
renders it as tables.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Any

from . import ReplicaStore, StateBackend
from ._sizes import format_bytes
from .errors import InvalidArgumentError, NotFoundError, RhinoError

__all__ = ["detect", "inspect_path", "inspect_state", "inspect_store", "format_report"]


def _is_state(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "CURRENT"))


def _is_store(path: str) -> bool:
    return os.path.isdir(os.path.join(path, "pool")) and os.path.isdir(os.path.join(path, "checkpoints"))


def detect(path: str) -> str:
    """'state', 'store' or 'both' (live/ + store/); raises NotFoundError / InvalidArgumentError."""
    if not os.path.exists(path):
        raise NotFoundError(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise InvalidArgumentError(f"{path} is a file; expected a state directory or a replica store")
    if _is_state(path):
        return "state"
    if _is_store(path):
        return "store"
    if _is_state(os.path.join(path, "live")) or _is_store(os.path.join(path, "store")):
        return "both"
    raise InvalidArgumentError(
        f"{path} is neither a Rhino state directory (no CURRENT), a replica store (no pool/ and "
        f"checkpoints/) nor a directory holding live/ and store/")


def _dir_files(path: str) -> list[tuple[str, int]]:
    out = []
    for name in sorted(os.listdir(path)):
        p = os.path.join(path, name)
        try:
            st = os.stat(p)
        except FileNotFoundError:  # removed under us (compaction): skip
            continue
        if os.path.isfile(p):
            out.append((name, st.st_size))
    return out


def inspect_state(path: str, *, exact: bool = False) -> dict[str, Any]:
    """Operator, instance, partitioner, version, last checkpoint, per-vnode keys and sizes."""
    files = _dir_files(path)
    db = StateBackend.open(path, read_only=True, create=False)
    try:
        p = db.partitioner
        vnodes = []
        for s in db.stats():
            v = int(s["vnode"])
            first, last = p.key_group_range(v)
            row: dict[str, Any] = {"vnode": v, "key_groups": [first, last],
                                   "estimated_keys": int(s["estimated_keys"]), "sst_bytes": int(s["sst_bytes"])}
            if exact:
                row["keys"] = int(db.count(v))
            vnodes.append(row)
        report: dict[str, Any] = {
            "path": os.path.abspath(path),
            "operator_id": db.operator_id,
            "instance": db.instance,
            "partitioner": {"num_key_groups": p.num_key_groups, "num_vnodes": p.num_vnodes, "seed": p.seed},
            "version": db.version,
            "last_checkpoint": db.last_checkpoint,
            "vnodes_held": len(vnodes),
            "estimated_keys": sum(r["estimated_keys"] for r in vnodes),
            "keys": sum(r["keys"] for r in vnodes) if exact else None,
            "counts": "exact" if exact else "estimate",
            "sst_bytes": sum(r["sst_bytes"] for r in vnodes),
            "disk_bytes": sum(size for _, size in files),
            "files": len(files),
            "sst_files": sum(1 for n, _ in files if n.endswith(".sst")),
            "wal_bytes": sum(size for n, size in files if n.endswith(".log")),
            "vnodes": vnodes,
        }
    finally:
        db.close()
    return report


def _iso(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000.0).isoformat(sep=" ", timespec="seconds") if ms else ""


def inspect_store(path: str) -> dict[str, Any]:
    """Every checkpoint of every (operator, instance), and the pool's totals."""
    store = ReplicaStore(path)
    referenced: dict[str, int] = {}
    instances = []
    for op, inst in sorted(store.instances()):
        rows = []
        for cid in store.checkpoints(op, inst):
            try:
                m = store.manifest(op, inst, cid)
            except RhinoError as e:  # show a broken manifest, do not hide the rest
                rows.append({"checkpoint_id": cid, "error": str(e)})
                continue
            for f in m.files:
                referenced[f.identity] = f.size
            rows.append({
                "checkpoint_id": m.checkpoint_id, "parent_id": m.parent_id, "epoch": m.epoch,
                "version": m.version, "files": len(m.files), "total_bytes": m.total_bytes,
                "delta_files": m.delta_files, "delta_bytes": m.delta_bytes, "vnodes": len(m.vnodes),
                "partitioner": {"num_key_groups": m.num_key_groups, "num_vnodes": m.num_vnodes, "seed": m.seed},
                "created": _iso(m.created_unix_ms),
            })
        instances.append({"operator_id": op, "instance": inst, "checkpoints": rows})
    pool = _dir_files(os.path.join(path, "pool"))
    pooled = {name: size for name, size in pool}
    unreferenced = [name for name in pooled if name not in referenced]
    tmp = os.path.join(path, "tmp")
    return {
        "path": os.path.abspath(path),
        "pool": {
            "files": len(pool),
            "bytes": sum(pooled.values()),
            "referenced_files": len(referenced),
            "referenced_bytes": sum(referenced.values()),
            "unreferenced_files": len(unreferenced),
            "unreferenced_bytes": sum(pooled[n] for n in unreferenced),
        },
        "staging_dirs": len(os.listdir(tmp)) if os.path.isdir(tmp) else 0,
        "instances": instances,
    }


def inspect_hosted(store_path: str) -> list[dict[str, Any]]:
    """The instances a worker hosts, from ``state/instances/*/*/instance.json`` beside its store
    (``rhino worker``'s default --state-dir): their configuration only, so it runs beside the worker."""
    import json

    root = os.path.join(store_path, "state", "instances")
    out: list[dict[str, Any]] = []
    if not os.path.isdir(root):
        return out
    for op in sorted(os.listdir(root)):
        for inst in sorted(os.listdir(os.path.join(root, op)), key=lambda n: (len(n), n)):
            d = os.path.join(root, op, inst)
            try:
                with open(os.path.join(d, "instance.json")) as f:
                    c = json.load(f)
            except (OSError, ValueError) as e:
                out.append({"operator_id": op, "instance": inst, "error": str(e)})
                continue
            out.append({"operator_id": c.get("operator_id"), "instance": c.get("instance"), "epoch": c.get("epoch"),
                        "vnodes": len(c.get("vnodes", [])), "chain": c.get("chain", []),
                        "chain_version": c.get("chain_version"),
                        "hosted": not os.path.exists(os.path.join(d, "CLOSED")),
                        "discard_pending": c.get("discard_pending", False)})
    return out


def inspect_path(path: str, *, exact: bool = False) -> dict[str, Any]:
    kind = detect(path)
    report: dict[str, Any] = {"path": os.path.abspath(path), "kind": kind, "state": None, "store": None}
    if kind == "state":
        report["state"] = inspect_state(path, exact=exact)
    elif kind == "store":
        report["store"] = inspect_store(path)
        report["hosted"] = inspect_hosted(path)
    else:
        live, store = os.path.join(path, "live"), os.path.join(path, "store")
        if _is_state(live):
            report["state"] = inspect_state(live, exact=exact)
        if _is_store(store):
            report["store"] = inspect_store(store)
    return report


# ---------------------------------------------------------------- rendering

def _table(headers: list[str], rows: list[list[Any]], indent: str = "  ") -> list[str]:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for j, r in enumerate(cells):
        parts = [c.rjust(w) for c, w in zip(r, widths)]
        lines.append(indent + "  ".join(parts).rstrip())
        if j == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return lines


def _fmt_state(s: dict[str, Any]) -> list[str]:
    p = s["partitioner"]
    keys = (f"{s['keys']:,} (exact, by scanning every vnode)" if s["keys"] is not None
            else f"{s['estimated_keys']:,} (RocksDB estimate; --exact counts them)")
    lines = [
        f"Live state  {s['path']}",
        f"  operator / instance  {s['operator_id']} / {s['instance']}",
        f"  partitioner          K={p['num_key_groups']} key groups, V={p['num_vnodes']} vnodes, seed={p['seed']}",
        f"  version              {s['version'] if s['version'] is not None else '- (none written)'}",
        f"  last checkpoint      {s['last_checkpoint'] if s['last_checkpoint'] is not None else '- (never)'}",
        f"  vnodes held          {s['vnodes_held']} of {p['num_vnodes']}",
        f"  keys                 {keys}",
        f"  size on disk         {format_bytes(s['disk_bytes'])} in {s['files']} files "
        f"({s['sst_files']} SST files, {format_bytes(s['sst_bytes'])} live SST; WAL {format_bytes(s['wal_bytes'])})",
        "",
    ]
    exact = s["keys"] is not None
    per_line = 3
    headers = []
    for _ in range(per_line):
        headers += ["vnode", "key groups", "keys" if exact else "keys (est.)", "SST"]
    rows = []
    vn = s["vnodes"]
    for i in range(0, len(vn), per_line):
        row: list[Any] = []
        for r in vn[i:i + per_line]:
            kg = r["key_groups"]
            row += [f"{r['vnode']}", f"[{kg[0]}, {kg[1]})", f"{r['keys'] if exact else r['estimated_keys']:,}",
                    format_bytes(r["sst_bytes"])]
        row += [""] * (len(headers) - len(row))
        rows.append(row)
    if rows:
        lines += _table(headers, rows)
    return lines


def _fmt_store(s: dict[str, Any]) -> list[str]:
    pool = s["pool"]
    lines = [
        f"Replica store  {s['path']}",
        f"  pool       {pool['files']} files, {format_bytes(pool['bytes'])}; {pool['unreferenced_files']} of them "
        f"({format_bytes(pool['unreferenced_bytes'])}) referenced by no checkpoint (reclaimable by gc)",
        f"  staging    {s['staging_dirs']} directories under tmp/",
    ]
    if not s["instances"]:
        lines.append("  (no checkpoints)")
    for inst in s["instances"]:
        cps = inst["checkpoints"]
        lines += ["", f"  {inst['operator_id']} / instance {inst['instance']}: {len(cps)} checkpoint(s)"]
        rows = []
        for c in cps:
            if "error" in c:
                rows.append([c["checkpoint_id"], "ERROR: " + c["error"]] + [""] * 8)
                continue
            rows.append([c["checkpoint_id"], "-" if c["parent_id"] is None else c["parent_id"], c["epoch"],
                         c["version"], c["vnodes"], c["files"], format_bytes(c["total_bytes"]), c["delta_files"],
                         format_bytes(c["delta_bytes"]), c["created"]])
        lines += _table(["checkpoint", "parent", "epoch", "version", "vnodes", "files", "bytes",
                         "delta files", "delta bytes", "created"], rows, indent="    ")
    return lines


def format_report(report: dict[str, Any]) -> str:
    out: list[str] = []
    if report.get("state"):
        out += _fmt_state(report["state"])
    if report.get("store"):
        if out:
            out.append("")
        out += _fmt_store(report["store"])
    if report.get("hosted"):
        out += ["", "  hosted instances (state service, state/; docs/protocol.md §7):"]
        rows = [[h["operator_id"], h["instance"], "error: " + h["error"], "", "", ""] if "error" in h else
                [h["operator_id"], h["instance"], h["epoch"], h["vnodes"],
                 " -> ".join(h["chain"]) or "(r = 0)", "yes" if h["hosted"] else "closed"]
                for h in report["hosted"]]
        out += _table(["operator", "instance", "epoch", "vnodes", "chain", "hosted"], rows, indent="    ")
    return "\n".join(out)

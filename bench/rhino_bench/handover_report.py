"""``rhino-bench handover``: the plot and the report of its records (they read the JSON lines alone)."""

from __future__ import annotations


from rhino._machine import machine_summary
from rhino._sizes import format_bytes
from rhino.coordinator.strategies import STRATEGIES
from .report import md_table, pyplot, save, write_lines


# ---- the plot and the report ---------------------------------------------------------------------


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()

    runs = [r for r in rows if r.get("record") == "run"]
    strategies = [s for s in STRATEGIES if any(r["strategy"] == s for r in runs)]
    fig, axes = plt.subplots(len(strategies), 1, figsize=(10, 2.6 * len(strategies) + 0.6), sharex=True,
                             squeeze=False)
    for ax, s in zip(axes[:, 0], strategies):
        for r in [r for r in runs if r["strategy"] == s]:
            t0 = r["migration_start_unix"]
            tl = [b for b in r["timeline"] if b["phase"] != "warmup"]
            xs = [b["start_unix"] - t0 for b in tl]
            ys = [b["seconds"] * 1e3 for b in tl]
            line, = ax.plot(xs, ys, marker=".", lw=1, label=f"run {r['rep']}: max {r['max_during_s'] * 1e3:.0f} ms, "
                                                           f"{r['ratio_max_to_steady']:.1f}x steady")
            steps = [(x, y) for x, y, b in zip(xs, ys, tl) if b["steps_run"]]
            ax.plot([x for x, _ in steps], [y for _, y in steps], ls="", marker="x", color=line.get_color(), ms=6)
            ax.axvspan(0, r["migration_end_unix"] - t0, color=line.get_color(), alpha=0.12)
            ax.axhline(r["steady_median_s"] * 1e3, color=line.get_color(), ls=":", lw=1)
        ax.set_ylabel("batch latency, ms")
        ax.set_title(f"{s}: batches that ran a step marked x, migration window shaded, steady median dotted",
                     fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the migration's first step")
    setup = next((r for r in rows if r.get("record") == "setup"), {})
    fig.suptitle(f"rhino-bench handover: {format_bytes(setup.get('state_bytes', 0))} state, "
                 f"{setup.get('batch_keys')} puts of {setup.get('value_bytes')} B per batch", fontsize=11)
    save(fig, path)


def report(rows: list[dict], path: str) -> None:
    setup = next(r for r in rows if r.get("record") == "setup")
    runs = [r for r in rows if r.get("record") == "run"]
    summary = [r for r in rows if r.get("record") == "summary"]
    m = setup["machine"]
    lines = ["# Handover: the writer's batch latency during a migration, per strategy", "",
             f"Command: `{setup['command']}`", "",
             f"Run at {setup['unix']} on {machine_summary(m)}. Four `rhino worker` processes "
             f"({', '.join(setup['workers'])}), the in-process coordinator and the writer share the machine's "
             f"{m.get('cpu_cores')} cores and one disk.", "",
             f"Parameters: state {format_bytes(setup['state_bytes'])} ({setup['value_bytes']}-byte random values), "
             f"operator of {setup['parallelism']} instances, {setup['num_vnodes']} vnodes, r={setup['replicas']}; "
             f"after the fill a sync and {setup.get('quiesce_s', 0)} s of quiet; "
             f"timed batches of {setup['batch_keys']} puts to random keys ({setup['warmup_batches']} warm-up, "
             f"{setup['steady_batches']} steady, then the migration, then {setup['after_batches']} more); "
             f"handover of half of instance 0's vnodes to a new instance; {setup['repeat']} repetitions, the "
             f"strategies' order rotating; figures are medians over the repetitions.", "",
             ""]
    lines += md_table(["strategy", "steps", "migration (first step to last), s", "time in steps, s",
                       "one step, s (median, max)", "bytes copied (plan)", "steady median batch (max), ms",
                       "max batch during migration, ms", "max / steady median", "per-run ratios", "max / steady max",
                       "replication bytes in the migration's batches (batches)", "steady, per batch", "state correct"],
                      [(s["strategy"], s["steps"], f"{s['migration_s']:.2f}", f"{s['steps_s']:.2f}",
                        f"{s['step_s_median']:.3f}, {s['step_s_max']:.3f}", f"{s['bytes_moved']:,}",
                        f"{s['steady_median_s'] * 1e3:.0f} ({s['steady_max_s'] * 1e3:.0f})",
                        f"{s['max_during_s'] * 1e3:.0f}", f"{s['ratio_max_to_steady']:.2f}x",
                        ", ".join(f"{x:.2f}" for x in s["ratio_runs"]), f"{s['ratio_max_to_steady_max']:.2f}x",
                        f"{format_bytes(s['net_bytes_during'])} ({s['batches_during']})",
                        format_bytes(s["steady_net_bytes_per_batch"]), "yes" if s["correct"] else "NO")
                       for s in summary], "lrrrrrrrrlrrrl")
    lines += ["", "Per run:", ""]
    lines += md_table(["strategy", "run", "state", "vnodes moved", "new instance on", "origin (primary, chain)",
                       "migration, s", "steps", "max during, ms", "steady median, ms", "correct"],
                      [(r["strategy"], r["rep"], format_bytes(r["state_bytes"]),
                        f"{r['vnodes_moved']} of {r['origin_vnodes']}", f"{r['target_primary']} ({r['placement']})",
                        f"{r['origin_primary']}, {r['origin_chain']}", f"{r['migration_s']:.2f}", r["steps"],
                        f"{r['max_during_s'] * 1e3:.0f}", f"{r['steady_median_s'] * 1e3:.0f}",
                        "yes" if r["correct"] else "NO") for r in runs], "lrrrllrrrrl")
    vertical = all(r["vertical"] for r in runs)
    lines += ["",
              "Placement: " + ("in every run the new instance went to a worker that holds the origin's checkpoint "
                               "(vertical scaling): its vnodes were imported by hard links, and no bytes of the "
                               "origin's state crossed the network (bytes copied = 0)." if vertical else
                               "in some runs the new instance went to a worker without the origin's checkpoint, "
                               "which first received a bulk copy (bytes copied > 0)."),
              "Replication bytes are the chunk bytes all workers received from a predecessor (their "
              "`rhino_worker_bytes_received_total`) during the batches in which steps ran, against the steady "
              "median per batch: every commit replicates its checkpoint's delta (new L0 files, and the outputs of "
              "compactions, so it varies from batch to batch), and a new instance's first checkpoint goes to its "
              "own chain. It is replication, not a fetch of the origin's state.",
              "The steady batches are not steady: with leveled compaction each vnode's L0 is merged into its L1 "
              "every fourth checkpoint, and that compaction's output goes down the chain with the next commit, "
              "so every fourth or so batch replicates 100-190 MB instead of about 5 (the per-batch `net_bytes` of "
              "the timelines in the JSON lines) and takes 2-3x as long. A migration that spans several batches "
              "meets those batches, so 'max / steady max' is shown beside Megaphone's 'max / steady median'.",
              "Each step runs at the barrier before a batch, inside `begin_batch`, so a step's time is part of "
              "that batch's latency: the measure is Megaphone's (the maximum latency during a migration, "
              "against the steady state). With one origin and one target, `batched` (a matching of origins "
              "and targets per step) moves one vnode per step, like `fluid`."]
    write_lines(path, lines)

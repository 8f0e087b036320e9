"""`rhino-bench spark elastic`, its pure parts only (no Spark, no cluster): the summary from
synthetic batch and reconfiguration lines, with the expected values worked out by hand below;
the arrival schedule's arithmetic; the report and the plot redone from lines with ``--from``."""

from __future__ import annotations

import json

import pytest

from rhino_bench.spark import elastic

S = 10.0  # the trigger interval of the synthetic runs


def _row(system, batch, phase, step, rate, lat, p, events=1000, failed=False):
    return {"record": "batch", "system": system, "batch": batch, "phase": phase, "step": step, "rate_x": rate,
            "t": 10.0 * batch, "t_unix": 1e9 + 10.0 * batch, "latency_s": lat, "events": events, "parallelism": p,
            "failed": failed, "end_offset": 1000 * (batch + 1), "start_offset": 1000 * batch}


def _rhino_rows():
    w, s = "warmup", "steps"
    return [
        _row("rhino", 0, w, None, None, 20.0, 1), _row("rhino", 1, w, None, None, 6.0, 1),
        # step 0, 1x: the steady median is median(4, 5, 3) = 4
        _row("rhino", 2, s, 0, 1.0, 4.0, 1), _row("rhino", 3, s, 0, 1.0, 5.0, 1), _row("rhino", 4, s, 0, 1.0, 3.0, 1),
        # step 1, 3x: a partial batch, two over, the scale-out decided on 6 runs at 7's barrier
        _row("rhino", 5, s, 1, 3.0, 8.0, 1), _row("rhino", 6, s, 1, 3.0, 14.0, 1), _row("rhino", 7, s, 1, 3.0, 12.0, 2),
        _row("rhino", 8, s, 1, 3.0, 11.0, 2, failed=True), _row("rhino", 9, s, 1, 3.0, 7.0, 2),
        _row("rhino", 10, s, 1, 3.0, 6.0, 2),
        # step 2, 1x: the scale-in decided on 12 runs at 13's barrier
        _row("rhino", 11, s, 2, 1.0, 5.0, 2), _row("rhino", 12, s, 2, 1.0, 4.0, 2), _row("rhino", 13, s, 2, 1.0, 6.0, 1),
        _row("rhino", 14, s, 2, 1.0, 3.0, 1),
        # a no-data batch (only the watermark moved): counted nowhere
        _row("rhino", 15, s, 2, 1.0, 30.0, 1, events=0),
    ]


def _reconfs():
    return [
        {"record": "reconfiguration", "system": "rhino", "plan": 1, "action": "scale_out", "from": 1, "to": 2,
         "decided_batch": 6, "decided_t": 65.0, "strategy": "all-at-once", "steps": 1, "step_batches": [7],
         "step_t": [70.5], "step_seconds": [0.2], "bytes_copied": 0, "done_batch": 7, "reason": "needs 2"},
        {"record": "reconfiguration", "system": "rhino", "plan": 2, "action": "scale_in", "from": 2, "to": 1,
         "decided_batch": 12, "decided_t": 125.0, "strategy": "all-at-once", "steps": 1, "step_batches": [13],
         "step_t": [130.5], "step_seconds": [0.1], "bytes_copied": 0, "done_batch": 13, "reason": "3 reports"},
        # a decision whose plan could not be made spans no batch
        {"record": "reconfiguration", "system": "rhino", "plan": None, "action": "scale_out", "from": 2, "to": 3,
         "decided_batch": 9, "error": "BusyError: a plan is in flight"},
    ]


def _spark_rows():
    w, s = "warmup", "steps"
    lat = {2: 6.0, 3: 7.0, 4: 6.0, 5: 9.0, 6: 16.0, 7: 22.0, 8: 25.0, 9: 27.0, 10: 20.0, 11: 12.0, 12: 9.0}
    step = {2: 0, 3: 0, 4: 0, 5: 1, 6: 1, 7: 1, 8: 1, 9: 2, 10: 2, 11: 2, 12: 2}
    rate = {0: 1.0, 1: 3.0, 2: 1.0}
    rows = [_row("spark-rocksdb", 0, w, None, None, 15.0, 3), _row("spark-rocksdb", 1, w, None, None, 7.0, 3)]
    rows += [_row("spark-rocksdb", b, s, step[b], rate[step[b]], lat[b], 3) for b in range(2, 13)]
    # the remedy's batches are not part of the steps
    rows += [_row("spark-rocksdb", 13, "pre_restart", None, 3.0, 30.0, 3),
             _row("spark-rocksdb", 14, "restart", None, 3.0, 18.0, 3, failed=True)]
    return rows


_RESTART = {"record": "restart", "system": "spark-rocksdb", "rate_x": 3.0, "trigger_interval_s": S, "remedy_s": 30.5,
            "stop_s": 1.5, "restart_s": 29.0, "first_batch": 14, "first_batch_s": 18.0, "first_batch_events": 500000,
            "state_load_s": 0.4, "host_join_s": 25.0, "executors_before": 3, "executors_after": 4,
            "state_partitions_before": 3, "state_partitions_after": 3, "batches_after": 0, "latencies_after_s": [],
            "latency_after_median_s": None, "kept_up_after": False, "stop_t": 140.0, "first_end_t": 170.5}


def test_rhino_summary_by_hand():
    s = elastic.summarize_system("rhino", _rhino_rows(), _reconfs(), S)
    assert s["steady_median_s"] == 4.0
    # step 1: latencies 8, 14, 12, 11, 7, 6: from batch 9 (its 5th, index 4) on every batch is under 10 s
    # step 2: 5, 4, 6, 3: all under: 0
    assert [(p["step"], p["recovered_within_batches"], p["recovered"]) for p in s["per_step"]] == [
        (1, 4, True), (2, 0, True)]
    assert s["recovered_within_batches"] == 4 and s["recovered_all_steps"] is True
    # the scale-out spans batch 7 (12 s = 3x the steady 4 s), the scale-in batch 13 (6 s = 1.5x)
    assert [(w["batches"], w["worst_s"], w["spike_x"]) for w in s["per_rescale"]] == [([7], 12.0, 3.0),
                                                                                     ([13], 6.0, 1.5)]
    assert s["rescale_spike_x"] == 3.0 and s["rescales"] == 2
    assert s["failed_batches"] == 1
    assert (s["parallelism_min"], s["parallelism_max"]) == (1, 2)
    assert s["parallelism_by_step"] == [1, 2, 1] and s["parallelism_follows_rate"] is True
    assert s["latency_max_s"] == 14.0 and s["batches"] == 13
    assert s["targets"] == {"recovered_within_5": True, "parallelism_follows_rate": True, "no_failed_batch": False,
                            "rescale_spike_at_most_2x": False}
    assert s["targets_met"] is False


def test_spark_summary_by_hand():
    s = elastic.summarize_system("spark-rocksdb", _spark_rows(), [], S, restart=_RESTART)
    assert s["steady_median_s"] == 6.0  # median(6, 7, 6)
    # step 1: 9, 16, 22, 25: still over at its end: not recovered, its 4 batches
    # step 2: 27, 20, 12, 9: the last one only: 3
    assert [(p["recovered_within_batches"], p["recovered"]) for p in s["per_step"]] == [(4, False), (3, True)]
    assert s["recovered_within_batches"] == 4 and s["recovered_all_steps"] is False
    assert s["rescale_spike_x"] is None and s["rescales"] == 0
    assert s["failed_batches"] == 0  # the restart phase's batches are not counted
    assert (s["parallelism_min"], s["parallelism_max"]) == (3, 3)
    assert s["parallelism_follows_rate"] is False
    assert s["targets"]["recovered_within_5"] is False and s["targets"]["rescale_spike_at_most_2x"] is None
    assert s["restart"]["remedy_s"] == 30.5 and s["restart"]["first_batch_x"] == 3.0


def test_a_step_without_a_change_of_rate_and_a_failed_query():
    rows = [_row("rhino", 0, "steps", 0, 1.0, 4.0, 1), _row("rhino", 1, "steps", 1, 1.0, 4.0, 1)]
    s = elastic.summarize_system("rhino", rows, [], S, failures=1)
    assert s["parallelism_follows_rate"] is None and s["targets"]["parallelism_follows_rate"] is None
    assert s["failed_batches"] == 1 and s["recovered_within_batches"] == 0
    assert s["rescale_spike_x"] is None and s["targets"]["rescale_spike_at_most_2x"] is None


def test_schedule_arithmetic():
    src = pytest.importorskip("rhino_bench.spark.elastic_source")
    sched = {"first": 500, "segments": [[100.0, 10.0], [110.0, 30.0], [120.0, 0.0]]}
    assert src.offset_at(sched, 99.0) == 500 and src.offset_at(sched, 100.0) == 500
    assert src.offset_at(sched, 105.0) == 550 and src.offset_at(sched, 110.0) == 600
    assert src.offset_at(sched, 115.0) == 750 and src.offset_at(sched, 1e9) == 900
    assert src.arrival_time(sched, 500) == pytest.approx(100.1)   # the first event: 1/10 s in
    assert src.arrival_time(sched, 599) == pytest.approx(110.0)   # the 100th: at the step
    assert src.arrival_time(sched, 600) == pytest.approx(110.0 + 1 / 30)
    assert src.arrival_time(sched, 900) is None                   # never: the stream stopped at 900
    segs = src.segments_for(start=1000.0, rates=[1, 3, 1], base_eps=100.0, step_s=50.0)
    assert segs == [[1000.0, 100.0], [1050.0, 300.0], [1100.0, 100.0], [1150.0, 0.0]]
    assert src.offset_of('{"next_event_id": 42}') == 42 and src.offset_of({"next_event_id": 7}) == 7
    assert src.offset_of(None) is None and src.offset_of("garbage") is None


def _lines():
    setup = {"record": "setup", "command": "rhino-bench spark elastic --json", "started": "2026-11-26T19:00:00Z",
             "machine": {}, "spark_conf": {}, "parameters": {"trigger_interval_s": S, "rates": [1.0, 3.0, 1.0]}}
    sched = [{"record": "schedule", "system": sys_, "trigger_interval_s": S, "base_events": 50000,
              "batches_per_step": 3, "steps": [{"step": k, "rate_x": r, "t": 20.0 + 30 * k, "offset": 1000 * k,
                                                "events_per_s": 5000.0 * r} for k, r in enumerate([1.0, 3.0, 1.0])],
              "end_t": 110.0, "segments_t": [[0.0, 5000.0], [20.0, 5000.0], [50.0, 15000.0], [80.0, 5000.0],
                                             [110.0, 0.0]]}
             for sys_ in elastic.SYSTEMS]
    cal = {"record": "calibration", "system": "rhino", "base_load": 0.35, "base_events": 50000,
           "instance_events_per_s": 14285.7, "instance_records_per_s": 1142.9, "events_per_record": 12.5}
    return ([setup, cal] + sched + _rhino_rows() + _reconfs()[:2] + _spark_rows() + [_RESTART]
            + [{"record": "query_failed", "system": "spark-rocksdb", "error": "boom"}])


def test_report_and_plot_from_lines(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    src = tmp_path / "elastic.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in _lines()) + "\n")
    md, png = tmp_path / "r.md", tmp_path / "p.png"
    assert elastic.main(["--from", str(src), "--report", str(md), "--plot", str(png)]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert [s["system"] for s in out] == ["rhino", "spark-rocksdb"]
    assert out[0]["recovered_within_batches"] == 4 and out[0]["rescale_spike_x"] == 3.0
    assert out[1]["failed_batches"] == 1  # the query_failed line
    text = md.read_text()
    assert "Command: `rhino-bench spark elastic --json`" in text
    assert "| rhino | 4 | yes | 3.00x | 1 | 1 | 2 | [1, 2, 1] | yes |" in text
    assert "| spark-rocksdb | 4 | no | - | 1 | 3 | 3 | [3, 3, 3] | no |" in text
    assert "**not met**" in text and "**met**" in text
    assert "scale_out 1->2 3.00x (batch 7)" in text
    assert "remedy_s" in text and "30.50 s" in text
    assert "## rhino: every batch" in text and "## spark-rocksdb: every batch" in text
    assert "1x = 0.35 x that = **50,000 events per trigger interval**" in text
    assert png.exists() and png.stat().st_size > 10_000


def test_bad_arguments():
    ap = elastic.build_parser()
    for bad in (["--rates", "1,0"], ["--systems", "flink"], ["--strategy", "none"], ["--base-events", "0"]):
        with pytest.raises(SystemExit):
            ap.parse_args(bad)
    a = ap.parse_args(["--systems", "spark,rhino", "--base-events", "auto"])
    assert a.systems == ["rhino", "spark-rocksdb"] and a.base_events is None
    assert elastic.main(["--systems", "spark-rocksdb", "--from", "/nonexistent"]) == 2


def test_the_source_reads_what_the_schedule_says_has_arrived(tmp_path):
    """The data source's reader in this process (no JVM): offsets from the schedule file, the
    nexmark options passed through, ours refused where they conflict; it pickles (Spark ships it)."""
    pytest.importorskip("pyspark")
    import time

    from pyspark import cloudpickle
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rhino_bench.spark.elastic_source import ElasticNexmarkSource, write_schedule

    path = tmp_path / "schedule.json"
    now = time.time()
    write_schedule(path, {"first": 0, "segments": [[now - 10.0, 100.0], [now - 5.0, 0.0]]})  # 500 events, then none
    r = ElasticNexmarkSource({"scheduleFile": str(path), "numPartitions": "2", "payloadBytes": "16"}).streamReader(
        schema=None)
    start = r.initialOffset()
    assert start == {"next_event_id": 0} and isinstance(r.getDefaultReadLimit(), ReadAllAvailable)
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"next_event_id": 500}
    parts = r.partitions(start, end)
    assert [(p.start, p.end) for p in parts] == [(0, 250), (250, 500)]
    assert sum(b.num_rows for p in parts for b in r.read(p)) == 500
    # the driver appends a segment: the reader sees it at its next call
    write_schedule(path, {"first": 0, "segments": [[now - 10.0, 100.0], [now - 5.0, 0.0], [now - 1.0, 50.0]]})
    assert r.latestOffset(end, ReadAllAvailable())["next_event_id"] >= 550
    assert cloudpickle.loads(cloudpickle.dumps(r)).schedule_file == str(path)
    with pytest.raises(ValueError, match="scheduleFile"):
        ElasticNexmarkSource({"numPartitions": "2"}).streamReader(schema=None)
    with pytest.raises(ValueError, match="eventsPerSecond"):
        ElasticNexmarkSource({"scheduleFile": str(path), "eventsPerSecond": "5"}).streamReader(schema=None)

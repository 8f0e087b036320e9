"""``with_ticks(..., checkpoint_location=...)``'s checkpoint step on its own (issue 45): a
checkpoint made without ticks gains the ticks' starting offset in each offset-log entry, once.
The files are Spark's format as Spark 4 writes them (the version line, the batch's metadata,
one offset per source); tests/test_spark_quiet.py runs the step against Spark itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhino.errors import InvalidArgumentError
from rhino.spark.driver.watermark import LocalFiles
from rhino.spark.ticks import adopt_ticks

META = '{"batchWatermarkMs":0,"batchTimestampMs":1796676154120,"conf":{}}'


def _offsets(ck: Path, entries: dict[int, list[str]], version: str = "v1") -> None:
    (ck / "offsets").mkdir(parents=True)
    for b, offs in entries.items():
        (ck / "offsets" / str(b)).write_text("\n".join([version, META, *offs]))


def test_a_checkpoint_without_ticks_gains_them_once(tmp_path: Path) -> None:
    _offsets(tmp_path, {0: ['{"logOffset":0}'], 1: ['{"logOffset":1}']})
    (tmp_path / "offsets" / ".1.crc").write_bytes(b"x")  # Hadoop's checksum file: not an entry
    assert adopt_ticks(LocalFiles(str(tmp_path)), str(tmp_path), sources=2) == [0, 1]
    for b, off in ((0, '{"logOffset":0}'), (1, '{"logOffset":1}')):
        assert (tmp_path / "offsets" / str(b)).read_text().split("\n") == ["v1", META, off, "0"]
    # again: nothing to do, nothing changed
    assert adopt_ticks(LocalFiles(str(tmp_path)), str(tmp_path), sources=2) == []
    assert (tmp_path / "offsets" / "1").read_text().split("\n")[2:] == ['{"logOffset":1}', "0"]


def test_a_checkpoint_with_ticks_or_another_count_is_left_alone(tmp_path: Path) -> None:
    _offsets(tmp_path, {0: ['{"logOffset":0}', "3"], 1: ["{}", "{}", "{}"]})
    before = {p.name: p.read_text() for p in (tmp_path / "offsets").iterdir()}
    assert adopt_ticks(LocalFiles(str(tmp_path)), str(tmp_path), sources=2) == []
    assert {p.name: p.read_text() for p in (tmp_path / "offsets").iterdir()} == before
    assert adopt_ticks(LocalFiles(str(tmp_path / "none")), str(tmp_path / "none"), sources=2) == []  # no checkpoint


def test_an_offset_log_of_another_format_is_refused_by_name(tmp_path: Path) -> None:
    _offsets(tmp_path, {0: ['{"logOffset":0}']}, version="v2")
    with pytest.raises(InvalidArgumentError, match=r"offsets/0 is of offset log format 'v2', not 'v1'"):
        adopt_ticks(LocalFiles(str(tmp_path)), str(tmp_path), sources=2)

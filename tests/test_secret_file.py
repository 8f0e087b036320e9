"""The shared secret as a file: what the demo and benchmarks write is what the
workers read, the file is private from the moment it exists, and a worker
warns about a secret file that others can read.

The demo used to keep 32 raw random bytes while its workers read the file with
`read_secret_file`, which strips surrounding whitespace: about one run in
twenty failed authentication (seen once under load in `make test`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rhino.replication import read_secret_file
from rhino_testing.harness.workers import WorkerProcess, new_secret, write_secret


def test_a_new_secret_reads_back_unchanged(tmp_path: Path):
    # With raw random bytes, 500 draws would almost surely include one that starts or ends
    # with a whitespace byte (each draw: about 4.6%), which the reader strips.
    for i in range(500):
        d = tmp_path / str(i)
        d.mkdir()
        secret = new_secret()
        assert len(secret) >= 32
        assert read_secret_file(write_secret(d, secret)) == secret


def test_the_secret_file_is_private_from_the_start(tmp_path: Path):
    old = os.umask(0)  # a permissive umask must not widen it
    try:
        path = write_secret(tmp_path, b"s3cret")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    write_secret(tmp_path, b"other")  # rewriting an existing, wider file narrows it
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"other"


@pytest.mark.parametrize("bad", [b"", b" lead", b"trail\n", b"\tboth "])
def test_a_secret_the_reader_would_change_is_refused(tmp_path: Path, bad: bytes):
    with pytest.raises(ValueError, match="no surrounding whitespace"):
        write_secret(tmp_path, bad)
    assert not (tmp_path / "secret").exists()


@pytest.mark.parametrize("mode, warned", [(0o644, True), (0o640, True), (0o600, False)])
def test_a_worker_warns_when_others_can_read_its_secret_file(tmp_path: Path, mode: int, warned: bool):
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"rhino-test-secret\n")
    secret_file.chmod(mode)
    w = WorkerProcess(tmp_path, "wsecret", "127.0.0.16", secret_file=secret_file, metrics=False).start()
    try:
        events = [e for e in w.events() if e.get("event") == "secret_file_readable_by_others"]
    finally:
        w.stop()
    assert bool(events) == warned
    if warned:
        assert events[0]["mode"] == oct(mode) and events[0]["advice"] == f"chmod 600 {secret_file}"

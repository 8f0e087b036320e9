"""Bounds on what a peer can make a worker spend (issue 46).

Before authentication a peer is anybody, so a listener reads at most
kMaxHandshakeFrameBytes (1 KiB) of a frame from it (docs/protocol.md §2):

- A frame header announcing more, before the handshake, is answered with an ErrorRsp
  (Corruption, "over the pre-auth limit of 1024 bytes") and the connection is closed; the
  worker logs it.
- A flood of 2,000 unauthenticated connections, each sending a header that announces a
  4 MiB payload (within max_frame_bytes), leaves the worker's RSS within 64 MiB of where it
  was: 2,000 x 4 MiB would be 8 GiB if each got its buffer. A real session is served after.

An instance has at most 65536 vnodes (column families; docs/protocol.md §7.1 `open`):
more is InvalidArgument naming the limit, and the worker serves on.

The frames are built by tests/dataplane_wire.py, written from the document.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

import rhino
from dataplane_wire import CORRUPTION, RawClient, decode_status, frame
from rhino_bench.harness.workers import SECRET, WorkerProcess, write_secret

OP = "preauth"
FLOOD = 2000
ANNOUNCED = 4 << 20
RSS_BOUND_KIB = 64 << 10


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("preauth")
    w = WorkerProcess(root, "w1", "127.0.0.2", secret_file=write_secret(root, SECRET), metrics=False).start()
    with rhino.connect(w.unix_socket, secret=SECRET) as c:
        c.open_instance(OP, 0, epoch=1, num_vnodes=4)
        with c.session(OP, 0, batch=0, epoch=1) as s:
            s.put_batch(np.arange(10, dtype=np.int64), [b"v%d" % i for i in range(10)])
            s.commit()
    yield w
    assert w.alive(), "the worker died"
    w.stop()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _served(w: WorkerProcess) -> None:
    with rhino.connect(w.address, secret=SECRET) as c, c.session(OP, 0, batch=1, epoch=1) as s:
        assert s.get_batch(np.arange(10, dtype=np.int64)) == [b"v%d" % i for i in range(10)]


def test_a_big_frame_before_authentication_is_refused_by_name(worker) -> None:
    with RawClient(worker.address) as raw:
        raw.send(frame("HelloReq", length=1025))
        h, p = raw.recv()
        assert h["type"] == "ErrorRsp"
        code, msg = decode_status(p)
        assert code == CORRUPTION
        assert "before authentication is over the pre-auth limit of 1024 bytes" in msg, msg
        assert raw.closed_by_peer()
    assert "frame before authenticating (at most 1024)" in worker.log_path.read_text()
    _served(worker)


def test_a_flood_of_unauthenticated_4_mib_frames_costs_no_buffers(worker) -> None:
    host, port = worker.address.rsplit(":", 1)
    header = frame("HelloReq", length=ANNOUNCED)
    before = _rss_kib(worker.pid)
    peak = before
    socks: list[socket.socket] = []
    try:
        for i in range(FLOOD):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(header)
            socks.append(s)
            if i % 100 == 0:
                peak = max(peak, _rss_kib(worker.pid))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            peak = max(peak, _rss_kib(worker.pid))
            time.sleep(0.05)
    finally:
        for s in socks:
            s.close()
    print(f"RSS before {before} KiB, peak {peak} KiB during the flood")
    assert peak - before < RSS_BOUND_KIB, f"RSS grew by {(peak - before) >> 10} MiB during the flood"
    assert worker.alive()
    _served(worker)


@pytest.mark.parametrize("num_vnodes", [65537, 1 << 30])
def test_num_vnodes_over_the_limit_is_refused_by_name(worker, num_vnodes) -> None:
    with rhino.connect(worker.unix_socket, secret=SECRET) as c:
        start = time.monotonic()
        with pytest.raises(rhino.InvalidArgumentError, match="over the limit of 65536 vnodes"):
            c.open_instance(OP, 5, epoch=1, num_vnodes=num_vnodes, num_key_groups=1 << 30)
        assert time.monotonic() - start < 5  # refused before any column family is made
    assert worker.alive()
    _served(worker)

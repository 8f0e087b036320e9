"""The state service refuses what it must (docs/protocol.md §1, §2, §7), with
clear errors, and never crashes or loses committed state.

- The Unix socket is owner-only (0600) and still authenticated.
- A wrong secret is refused, over the Unix socket and over TCP.
- Malformed session frames close only that connection; frames on a stream
  with no session, unknown instances, unknown actions, bad JSON arguments,
  oversized frames and sessions over --max-session-bytes are refused with
  named errors.
- After all of it the worker still serves, and the committed state is intact.

The hostile frames are built by tests/dataplane_wire.py, an implementation of
the wire format written from the document, not from the C++.
"""

from __future__ import annotations

import os
import stat
import struct

import numpy as np
import pytest

import rhino
from dataplane_wire import ABORTED, CORRUPTION, INVALID_ARGUMENT, UNKNOWN_INSTANCE, Enc, RawClient, decode_status, frame
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

OP = "sec"
MAX_SESSION = 64 << 10


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("security")
    secret_file = write_secret(root, SECRET)
    w = WorkerProcess(root, "w2", "127.0.0.2", secret_file=secret_file, metrics=False,
                      extra_args=["--max-session-bytes", str(MAX_SESSION)]).start()
    c = rhino.connect(w.unix_socket, secret=SECRET)
    c.open_instance(OP, 0, epoch=1, num_vnodes=8)
    with c.session(OP, 0, batch=0, epoch=1) as s:
        s.put_batch(np.arange(100, dtype=np.int64), [b"v%d" % i for i in range(100)])
        s.commit()
    c.close()
    yield w
    assert w.alive(), "the worker died"
    w.stop()


def committed_intact(w: WorkerProcess) -> None:
    with rhino.connect(w.unix_socket, secret=SECRET) as c, c.session(OP, 0, batch=1, epoch=1) as s:
        assert s.get_batch(np.arange(100, dtype=np.int64)) == [b"v%d" % i for i in range(100)]


def authed(address: str) -> RawClient:
    raw = RawClient(address)
    h, p = raw.handshake(SECRET)
    assert h["type"] == "AuthRsp" and p == b"\x01"
    return raw


def test_unix_socket_is_owner_only_and_authenticated(worker) -> None:
    st = os.stat(worker.unix_socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()
    with pytest.raises(rhino.AuthFailedError):
        rhino.connect(worker.unix_socket, secret=b"not the secret")
    # Without the handshake nothing is served, even on the owner's own socket.
    with RawClient(str(worker.unix_socket)) as raw:
        raw.send(frame("SessionOpenReq", Enc().bytes_(OP).u32(0).u64(1).u64(1).done(), stream_id=1))
        assert raw.closed_by_peer()
    committed_intact(worker)


def test_wrong_secret_is_refused_over_tcp(worker) -> None:
    with pytest.raises(rhino.AuthFailedError):
        rhino.connect(worker.address, secret=b"not the secret")
    with RawClient(worker.address) as raw:
        h, p = raw.handshake(b"wrong")
        assert h["type"] == "ErrorRsp"
        assert raw.closed_by_peer()


@pytest.mark.parametrize("transport", ["unix", "tcp"])
@pytest.mark.parametrize("case", ["truncated-open", "forged-count", "bad-bool", "trailing-bytes", "commit-garbage"])
def test_malformed_session_frames_close_only_that_connection(worker, transport: str, case: str) -> None:
    address = str(worker.unix_socket) if transport == "unix" else worker.address
    other = rhino.connect(address, secret=SECRET)  # a bystander connection
    with authed(address) as raw:
        if case == "truncated-open":
            raw.send(frame("SessionOpenReq", Enc().bytes_(OP).u32(0).done(), stream_id=1))
        else:
            raw.send(frame("SessionOpenReq", Enc().bytes_(OP).u32(0).u64(1).u64(1).done(), stream_id=1))
            h, p = raw.recv_skipping_heartbeats()
            assert h["type"] == "SessionOpenRsp" and decode_status(p)[0] == 0
            payload = {
                "forged-count": struct.pack("<I", 0xFFFFFFF0) + b"xx",
                "bad-bool": Enc().u8(7).u32(0).bytes_(b"").u8(0).u32(0).bytes_(b"").u32(0).done(),
                "trailing-bytes": Enc().u8(1).u32(0).u32(0).done() + b"junk",
                "commit-garbage": b"\x00\x01\x02",
            }[case]
            t = {"forged-count": "GetReq", "bad-bool": "ScanReq", "trailing-bytes": "WriteReq",
                 "commit-garbage": "SessionCommitReq"}[case]
            raw.send(frame(t, payload, stream_id=1))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "ErrorRsp"
        code, message = decode_status(p)
        assert code == CORRUPTION and "invalid" in message
        assert raw.closed_by_peer()
    # The session of the closed connection was aborted: a new one opens at once.
    assert other.is_open
    with other.session(OP, 0, batch=1, epoch=1) as s:
        assert s.get_batch([1]) == [b"v1"]
    other.close()
    committed_intact(worker)


def test_refusals_with_named_errors(worker) -> None:
    with rhino.connect(worker.unix_socket, secret=SECRET) as c:
        with pytest.raises(rhino.UnknownInstanceError, match="does not host"):
            c.session("nosuch", 0, batch=0, epoch=1)
        with pytest.raises(rhino.UnknownInstanceError):
            c.session(OP, 9, batch=0, epoch=1)
        with pytest.raises(rhino.InvalidArgumentError, match="operator id"):
            c.open_instance("../escape", 0, epoch=1)
        with pytest.raises(rhino.InvalidArgumentError, match="needs the state at version"):
            c.session(OP, 0, batch=5, epoch=1)  # batches 1..4 were never committed
        with pytest.raises(rhino.StaleEpochError):
            c.session(OP, 0, batch=1, epoch=0)
        s = c.session(OP, 0, batch=1, epoch=1)
        with pytest.raises(rhino.SessionBusyError, match="already has an open session"):
            c.session(OP, 0, batch=1, epoch=1)
        with pytest.raises(rhino.InvalidArgumentError, match="max-session-bytes"):
            s.put_batch(np.arange(1000, dtype=np.int64), [b"x" * 100] * 1000)
        s.put_batch([7], [b"staged"])  # the session goes on after the refusal
        assert s.get_batch([7, 8]) == [b"staged", b"v8"]
        with pytest.raises(rhino.InvalidArgumentError, match="mode"):
            s.commit("sometimes")
        with pytest.raises(rhino.UnknownVnodeError):
            s.scan(vnode=99).__next__()
        s.abort()
        with pytest.raises(rhino.AbortedError):
            s.put_batch([1], [b"late"])
        with pytest.raises(TypeError):
            c.session(OP, 0, batch="1", epoch=1)
    committed_intact(worker)


def test_raw_refusals(worker) -> None:
    with authed(str(worker.unix_socket)) as raw:
        # A session frame on a stream that has no session: Aborted, the connection stays.
        raw.send(frame("WriteReq", Enc().u8(1).u32(1).bytes_(b"k").u32(1).bytes_(b"v").done(), stream_id=5))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "SessionRsp" and h["stream_id"] == 5 and decode_status(p)[0] == ABORTED
        # An instance request with arguments that are not JSON, or an unknown action.
        raw.send(frame("InstanceReq", Enc().u8(1).bytes_(OP).u32(0).u64(1).bytes_(b"{not json").done(), stream_id=6))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "InstanceRsp" and decode_status(p)[0] == INVALID_ARGUMENT
        raw.send(frame("InstanceReq", Enc().u8(77).bytes_(OP).u32(0).u64(1).bytes_(b"{}").done(), stream_id=7))
        h, p = raw.recv_skipping_heartbeats()
        code, message = decode_status(p)
        assert code == INVALID_ARGUMENT and "unknown instance action" in message
        # A write op that does not exist.
        raw.send(frame("SessionOpenReq", Enc().bytes_(OP).u32(0).u64(1).u64(1).done(), stream_id=8))
        h, p = raw.recv_skipping_heartbeats()
        assert decode_status(p)[0] == 0
        raw.send(frame("WriteReq", Enc().u8(9).u32(1).bytes_(b"k").u32(0).done(), stream_id=8))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "SessionRsp" and decode_status(p)[0] == INVALID_ARGUMENT
        # A session for an instance nobody hosts.
        raw.send(frame("SessionOpenReq", Enc().bytes_("nosuch").u32(0).u64(0).u64(1).done(), stream_id=9))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "SessionOpenRsp" and decode_status(p)[0] == UNKNOWN_INSTANCE
        # An answer type sent to a worker closes the connection.
        raw.send(frame("InstanceRsp", Enc().u32(0).bytes_(b"").bytes_(b"{}").done(), stream_id=10))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "ErrorRsp"
        assert raw.closed_by_peer()
    committed_intact(worker)


def test_oversized_frame_is_refused(worker) -> None:
    with authed(worker.address) as raw:
        # A header announcing a payload over max_frame_bytes: refused before anything is allocated.
        raw.send(frame("WriteReq", b"", stream_id=1, length=1 << 30))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "ErrorRsp" and decode_status(p)[0] == CORRUPTION
        assert raw.closed_by_peer()
    committed_intact(worker)


@pytest.mark.parametrize("action, field, extra", [(10, "ops", '"version": 1, '), (3, "redo", '"redo_version": 1, '),
                                                  (1, "vnodes", "")])
def test_deeply_nested_json_arguments_are_refused_and_the_worker_stays_up(worker, action, field, extra) -> None:
    """A 200 KB request whose JSON nests 100,000 levels deep (a reconfigure's `ops` once crashed
    a worker with a stack overflow): InvalidArgument naming the bound, a log line, and the
    worker serves on with its committed state."""
    levels = 100_000
    args = ("{" + extra + f'"{field}": ' + "[" * levels + "]" * levels + "}").encode()
    assert len(args) > 200_000
    with authed(str(worker.unix_socket)) as raw:
        raw.send(frame("InstanceReq", Enc().u8(action).bytes_(OP).u32(0).u64(1).bytes_(args).done(), stream_id=11))
        h, p = raw.recv_skipping_heartbeats()
        code, message = decode_status(p)
        assert h["type"] == "InstanceRsp" and code == INVALID_ARGUMENT, message
        assert "nested deeper than 8 levels" in message
    assert worker.alive()
    assert f"refused an instance request (action {action}, operator '{OP}')" in worker.log_path.read_text()
    committed_intact(worker)

"""The coordinator's transport (docs/protocol.md §8): _core.CoordServer calling a
Python handler for every CoordReq, and _core.StateClient.coord calling it.

- Round trips: many threads and many clients, each call gets its own answer,
  from this process and from other processes.
- A handler's exception becomes the answer's error class (the one table in
  bindings/errors.cc, reversed); the server keeps serving.
- The handshake is the workers' (§2): a wrong secret is refused.
- Malformed and unexpected frames (tests/dataplane_wire.py, written from the
  document) close only their own connection; a worker refuses a CoordReq.
- Handlers run on their own threads: a slow one does not hold the others, and
  close() while one runs (or at the interpreter's exit) waits for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest

import rhino
from rhino import _core
from dataplane_wire import AUTH_FAILED, CORRUPTION, Enc, RawClient, coord_req, decode_coord_rsp, decode_status, frame
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

REPO = Path(__file__).resolve().parent.parent


def echo(method: str, args: str) -> tuple[int, str, str]:
    return 0, "", json.dumps({"method": method, "args": json.loads(args)})


class Handler:
    """A handler with a few methods for the tests: echo, slow (sleeps args["s"]),
    raise_* (raises), ret (returns args["ret"] as the answer tuple)."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        self.server: _core.CoordServer | None = None

    def __call__(self, method: str, args: str):
        with self.lock:
            self.calls += 1
        a = json.loads(args)
        if method == "echo":
            return echo(method, args)
        if method == "slow":
            time.sleep(a["s"])
            return 0, "", json.dumps({"slept": a["s"], "tag": a.get("tag")})
        if method == "raise_stale_epoch":
            raise rhino.StaleEpochError("x")
        if method == "raise_session_busy":
            raise rhino.SessionBusyError("instance op/0 has a session")
        if method == "raise_value_error":
            raise ValueError("no such batch")
        if method == "raise_rhino_error":
            raise rhino.RhinoError("plain")
        if method == "ret":
            return tuple(a["ret"]) if isinstance(a["ret"], list) else a["ret"]
        if method == "big":
            return 0, "", json.dumps("x" * a["n"])
        if method == "close_server":
            assert self.server is not None
            self.server.close()
            return 0, "", "{}"
        return 1, f"no method {method}", ""


@pytest.fixture
def handler() -> Handler:
    return Handler()


@pytest.fixture
def server(handler):
    s = _core.CoordServer("127.0.0.1", 0, SECRET, handler, threads=4)
    handler.server = s
    yield s
    s.close()


def connect(server: _core.CoordServer, **kw) -> _core.StateClient:
    return _core.StateClient.connect(server.address, SECRET, **kw)


def authed(address: str) -> RawClient:
    raw = RawClient(address)
    h, p = raw.handshake(SECRET)
    assert h["type"] == "AuthRsp" and p == b"\x01"
    assert raw.server_authentic
    return raw


def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


# ---- round trips ----------------------------------------------------------------


def test_address_port_and_one_round_trip(server) -> None:
    assert server.address == f"127.0.0.1:{server.port}" and server.port > 0 and server.host == "127.0.0.1"
    with closing(connect(server)) as c:
        assert json.loads(c.coord("echo", '{"a": [1, "\\u00e9"]}')) == {"method": "echo", "args": {"a": [1, "é"]}}
    m = server.metrics()
    assert m["requests"] == 1 and m["requests_failed"] == 0 and m["connections_accepted"] == 1


def calls(client: _core.StateClient, t: int, n: int) -> list[tuple[dict, dict]]:
    out = []
    for i in range(n):
        args = {"thread": t, "i": i, "pad": "p" * ((t * 50 + i) % 97)}
        out.append((json.loads(client.coord("echo", json.dumps(args))), {"method": "echo", "args": args}))
    return out


def test_concurrent_calls_on_one_client_each_get_their_own_answer(server, handler) -> None:
    # 8 threads x 50 calls, all on one connection: up to 8 requests in flight,
    # each on its own stream, answered out of order by 4 handler threads.
    with closing(connect(server)) as c, ThreadPoolExecutor(8) as pool:
        results = [r for f in [pool.submit(calls, c, t, 50) for t in range(8)] for r in f.result()]
    assert len(results) == 400
    for got, want in results:
        assert got == want
    assert handler.calls == 400 and server.metrics()["requests"] == 400


def test_concurrent_calls_on_several_clients_each_get_their_own_answer(server) -> None:
    clients = [connect(server, client_id=f"c{t}") for t in range(8)]
    try:
        with ThreadPoolExecutor(8) as pool:
            results = [r for f in [pool.submit(calls, clients[t], t, 50) for t in range(8)] for r in f.result()]
    finally:
        for c in clients:
            c.close()
    assert len(results) == 400 and all(got == want for got, want in results)
    assert server.metrics()["connections_accepted"] == 8


CLIENT_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from concurrent.futures import ThreadPoolExecutor
    from rhino import _core

    address, tag = sys.argv[1], sys.argv[2]
    c = _core.StateClient.connect(address, os.environb[b"RHINO_TEST_SECRET"], client_id=tag)

    def run(t):
        bad = 0
        for i in range(50):
            args = {"proc": tag, "thread": t, "i": i}
            if json.loads(c.coord("echo", json.dumps(args))) != {"method": "echo", "args": args}:
                bad += 1
        return bad

    with ThreadPoolExecutor(4) as pool:
        bad = sum(pool.map(run, range(4)))
    c.close()
    print(json.dumps({"bad": bad}))
""")


def test_clients_in_other_processes(server, handler) -> None:
    env = dict(os.environ, RHINO_TEST_SECRET=SECRET.decode())
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, server.address, f"p{k}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO) for k in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        assert json.loads(out) == {"bad": 0}
    assert handler.calls == 3 * 4 * 50


# ---- errors -----------------------------------------------------------------------


def test_handler_exceptions_become_the_mapped_error_and_the_server_goes_on(server) -> None:
    with closing(connect(server)) as c:
        with pytest.raises(rhino.StaleEpochError) as e:
            c.coord("raise_stale_epoch", "{}")
        assert str(e.value) == "x"
        # the most derived class of the table: SessionBusyError, not its base BusyError
        with pytest.raises(rhino.SessionBusyError, match="^instance op/0 has a session$"):
            c.coord("raise_session_busy", "{}")
        # any other exception is a bug of the handler, and says which
        with pytest.raises(rhino.RhinoError, match="^ValueError: no such batch$") as e:
            c.coord("raise_value_error", "{}")
        assert type(e.value) is rhino.RhinoIOError  # the protocol's code for what it has no code for
        with pytest.raises(rhino.RhinoError, match="^RhinoError: plain$"):
            c.coord("raise_rhino_error", "{}")
        assert json.loads(c.coord("echo", "{}"))["method"] == "echo"
    m = server.metrics()
    assert m["requests"] == 5 and m["requests_failed"] == 4 and m["frames_rejected"] == 0


def test_handler_answers_with_codes_and_bad_answers_are_errors(server) -> None:
    with closing(connect(server)) as c:
        assert c.coord("ret", json.dumps({"ret": [0, "", '{"ok": 1}']})) == '{"ok": 1}'
        assert c.coord("ret", json.dumps({"ret": [0, "", None]})) == ""
        with pytest.raises(rhino.StaleEpochError, match="^epoch 3 < 4$"):
            c.coord("ret", json.dumps({"ret": [102, "epoch 3 < 4", ""]}))
        with pytest.raises(rhino.NotFoundError, match="^no method nope$"):
            c.coord("nope", "{}")
        # a code the protocol does not know is an I/O error naming it (§3)
        with pytest.raises(rhino.RhinoIOError, match="unknown error code 77: odd"):
            c.coord("ret", json.dumps({"ret": [77, "odd", ""]}))
        for bad in ["not a tuple", [0, ""], [0, "", "{}", 4], ["0", "", "{}"], [-1, "", "{}"], [0, "", 5]]:
            with pytest.raises(rhino.RhinoError, match="TypeError|ValueError"):
                c.coord("ret", json.dumps({"ret": bad}))
        assert c.coord("echo", "[]") == '{"method": "echo", "args": []}'


def test_close_inside_the_handler_is_refused_not_a_deadlock(server) -> None:
    with closing(connect(server)) as c:
        with pytest.raises(rhino.InvalidArgumentError, match="inside its own handler"):
            c.coord("close_server", "{}")
        assert json.loads(c.coord("echo", "{}"))["method"] == "echo"
    assert not server.closed


def test_arguments_the_client_refuses_before_sending(server) -> None:
    with closing(connect(server)) as c:
        for method in ["", "Echo", "echo!", "é", "a" * 65]:
            with pytest.raises(rhino.InvalidArgumentError, match=r"\[a-z_\]"):
                c.coord(method, "{}")
        with pytest.raises(rhino.InvalidArgumentError, match="more than a CoordReq carries"):
            c.coord("echo", json.dumps("x" * (1 << 20)))
        # nothing was sent: the connection is fine and the server saw no request
        assert c.is_open and json.loads(c.coord("echo", "{}"))["method"] == "echo"
    assert server.metrics()["requests"] == 1


def test_args_that_are_not_json_are_refused_without_calling_the_handler(server, handler) -> None:
    with closing(connect(server)) as c:
        for args in ["", "{", "{'a': 1}", "nan"]:
            with pytest.raises(rhino.InvalidArgumentError, match="not a JSON document"):
                c.coord("echo", args)
        assert handler.calls == 0
    with authed(server.address) as raw:  # not UTF-8: refused too, and the connection stays
        raw.send(frame("CoordReq", coord_req("echo", b'"\xff"'), stream_id=1))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "CoordRsp" and h["stream_id"] == 1
        assert decode_coord_rsp(p)[0] == 3
        raw.send(frame("CoordReq", coord_req("echo", b"{}"), stream_id=2))
        h, p = raw.recv_skipping_heartbeats()
        assert (h["type"], h["stream_id"]) == ("CoordRsp", 2) and decode_coord_rsp(p)[0] == 0
    assert handler.calls == 1


def test_a_result_too_large_for_a_frame_is_an_error_not_a_broken_connection(server) -> None:
    with closing(connect(server)) as c:
        with pytest.raises(rhino.InvalidArgumentError, match="more than a CoordRsp carries"):
            c.coord("big", json.dumps({"n": _core.MAX_FRAME_BYTES}))
        assert len(json.loads(c.coord("big", json.dumps({"n": 1 << 20})))) == 1 << 20
        assert c.is_open


# ---- the liveness lane (§8.1) -------------------------------------------------------


@pytest.mark.parametrize("lane", [True, False])
def test_lane_methods_never_queue_behind_slow_calls(handler, lane: bool) -> None:
    """64 slow calls fill every handler thread and the queue; a heartbeat in the liveness lane is
    answered at once, one outside it waits for a handler thread (so the test can fail)."""
    slow_s = 1.0
    s = _core.CoordServer("127.0.0.1", 0, SECRET, handler, threads=8,
                          lane_methods=["echo"] if lane else [], lane_threads=1)
    try:
        with closing(connect(s)) as c, ThreadPoolExecutor(64) as pool:
            slow = [pool.submit(c.coord, "slow", json.dumps({"s": slow_s, "tag": i})) for i in range(64)]
            wait_for(lambda: s.metrics()["handlers_running"] == 8)
            t0 = time.monotonic()
            assert json.loads(c.coord("echo", '{"hb": 1}'))["args"] == {"hb": 1}
            took = time.monotonic() - t0
            if lane:
                assert took < slow_s / 2, took
            else:
                assert took >= slow_s * 0.9, took  # behind at least one round of slow calls
            assert sorted(json.loads(f.result(timeout=120))["tag"] for f in slow) == list(range(64))
    finally:
        s.close()


def test_lane_without_threads_is_refused() -> None:
    with pytest.raises(rhino.InvalidArgumentError, match="lane_threads"):
        _core.CoordServer("127.0.0.1", 0, SECRET, echo, lane_methods=["heartbeat"], lane_threads=0)


def test_the_coordinators_lane_is_heartbeat_and_status() -> None:
    from rhino.coordinator.api import LANE_METHODS

    assert LANE_METHODS == ["heartbeat", "status"]


def test_bad_options_are_refused() -> None:
    with pytest.raises(TypeError, match="callable"):
        _core.CoordServer("127.0.0.1", 0, SECRET, "not callable")
    with pytest.raises(rhino.InvalidArgumentError, match="secret"):
        _core.CoordServer("127.0.0.1", 0, b"", echo)
    with pytest.raises(rhino.InvalidArgumentError, match="threads"):
        _core.CoordServer("127.0.0.1", 0, SECRET, echo, threads=0)
    with pytest.raises(rhino.InvalidArgumentError, match="must exceed heartbeat_ms"):
        _core.CoordServer("127.0.0.1", 0, SECRET, echo, heartbeat_ms=500, peer_timeout_ms=500)
    with pytest.raises(rhino.InvalidArgumentError, match="max_frame_bytes"):
        _core.CoordServer("127.0.0.1", 0, SECRET, echo, max_frame_bytes=1000)
    with pytest.raises(rhino.InvalidArgumentError, match="not an IP address"):
        _core.CoordServer("localhost", 0, SECRET, echo)
    with _core.CoordServer("127.0.0.1", 0, SECRET, echo) as taken:
        with pytest.raises(rhino.RhinoIOError, match="cannot listen"):
            _core.CoordServer("127.0.0.1", taken.port, SECRET, echo)


# ---- authentication (§2) ------------------------------------------------------------


def test_wrong_secret_is_refused(server, handler) -> None:
    with pytest.raises(rhino.AuthFailedError):
        _core.StateClient.connect(server.address, b"not the secret")
    with RawClient(server.address) as raw:
        h, p = raw.handshake(b"not the secret")
        assert not raw.server_authentic  # the server does not know our secret either
        assert h["type"] == "ErrorRsp" and decode_status(p)[0] == AUTH_FAILED
        assert raw.closed_by_peer()
    # nothing before the handshake is served
    with RawClient(server.address) as raw:
        raw.send(frame("CoordReq", coord_req("echo", "{}"), stream_id=1))
        h, p = raw.recv()
        assert h["type"] == "ErrorRsp" and "before authentication" in decode_status(p)[1]
        assert raw.closed_by_peer()
    assert handler.calls == 0
    assert server.metrics()["auth_failures"] == 1  # the raw client's; the C++ client gave up first
    with closing(connect(server)) as c:
        assert json.loads(c.coord("echo", "{}"))["method"] == "echo"


# ---- malformed and unexpected frames ------------------------------------------------------

MALFORMED = {
    "truncated CoordReq": (frame("CoordReq", coord_req("echo", "{}")[:-3], stream_id=1), "runs past the end"),
    "bad method chars": (frame("CoordReq", coord_req("Echo", "{}"), stream_id=1), r"\[a-z_\]"),
    "empty method": (frame("CoordReq", coord_req("", "{}"), stream_id=1), r"\[a-z_\]"),
    "trailing bytes": (frame("CoordReq", coord_req("echo", "{}") + b"\0", stream_id=1), "trailing bytes"),
    "a WriteReq": (frame("WriteReq", Enc().u8(1).u32(1).bytes_(b"k").u32(1).bytes_(b"v").done(), stream_id=1),
                   "unexpected WriteReq sent to the coordinator"),
    "a CoordRsp": (frame("CoordRsp", Enc().u32(0).bytes_(b"").bytes_(b"{}").done(), stream_id=1),
                   "unexpected CoordRsp sent to the coordinator"),
    "an InstanceReq": (frame("InstanceReq", Enc().u8(7).bytes_(b"").u32(0).u64(0).bytes_(b"{}").done(), stream_id=1),
                       "unexpected InstanceReq sent to the coordinator"),
    "a CoordReq on stream 0": (frame("CoordReq", coord_req("echo", "{}"), stream_id=0), "CoordReq on stream 0"),
    "a bad payload checksum": (frame("CoordReq", coord_req("echo", "{}"), stream_id=1, payload_checksum=1),
                               "payload checksum"),
    "an unknown type": (frame(32, b"", stream_id=1), "unknown message type 32"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_frame_closes_only_its_connection(server, handler, case) -> None:
    data, match = MALFORMED[case]
    with closing(connect(server)) as good:
        assert json.loads(good.coord("echo", "{}"))["method"] == "echo"
        before = server.metrics()["frames_rejected"]
        with authed(server.address) as raw:
            raw.send(data)
            h, p = raw.recv_skipping_heartbeats()
            code, message = decode_status(p)
            assert h["type"] == "ErrorRsp" and code == CORRUPTION, (h, message)
            assert __import__("re").search(match, message), message
            assert raw.closed_by_peer()
        assert server.metrics()["frames_rejected"] == before + 1
        # the other connection, and the server, go on
        assert good.is_open and json.loads(good.coord("echo", '{"after": 1}'))["args"] == {"after": 1}
    assert handler.calls == 2


def test_a_second_request_on_a_stream_in_flight_is_a_protocol_error(server, handler) -> None:
    with authed(server.address) as raw:
        raw.send(frame("CoordReq", coord_req("slow", '{"s": 0.5}'), stream_id=1))
        wait_for(lambda: server.metrics()["handlers_running"] == 1)
        raw.send(frame("CoordReq", coord_req("echo", "{}"), stream_id=1))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "ErrorRsp" and h["stream_id"] == 1
        assert "still being handled" in decode_status(p)[1]
        assert raw.closed_by_peer()
    assert handler.calls == 1
    # once answered, a stream id may carry the next request (one at a time)
    with authed(server.address) as raw:
        for i in range(3):
            raw.send(frame("CoordReq", coord_req("echo", json.dumps({"i": i})), stream_id=7))
            h, p = raw.recv_skipping_heartbeats()
            assert (h["type"], h["stream_id"]) == ("CoordRsp", 7)
            assert json.loads(decode_coord_rsp(p)[2])["args"] == {"i": i}


def test_requests_on_one_raw_connection_are_answered_on_their_own_streams(server) -> None:
    # Sent back to back, answered as each handler finishes: the slow one last.
    with authed(server.address) as raw:
        raw.send(frame("CoordReq", coord_req("slow", '{"s": 0.4, "tag": "slow"}'), stream_id=1))
        for sid in range(2, 6):
            raw.send(frame("CoordReq", coord_req("echo", json.dumps({"sid": sid})), stream_id=sid))
        answers = [raw.recv_skipping_heartbeats() for _ in range(5)]
    assert all(h["type"] == "CoordRsp" for h, _ in answers)
    assert [h["stream_id"] for h, _ in answers][-1] == 1
    for h, p in answers:
        result = json.loads(decode_coord_rsp(p)[2])
        assert result == ({"slept": 0.4, "tag": "slow"} if h["stream_id"] == 1 else
                          {"method": "echo", "args": {"sid": h["stream_id"]}})


def test_a_silent_peer_is_declared_dead(handler) -> None:
    with _core.CoordServer("127.0.0.1", 0, SECRET, handler, heartbeat_ms=100, peer_timeout_ms=400) as s:
        with authed(s.address) as raw:
            # we never answer its heartbeats nor send anything: closed after peer_timeout_ms
            t0 = time.monotonic()
            assert raw.closed_by_peer(timeout=5)
            assert 0.3 < time.monotonic() - t0 < 3
        assert s.metrics()["peers_dead"] == 1
        # a client that answers heartbeats stays, idle, well past the timeout
        with closing(_core.StateClient.connect(s.address, SECRET, peer_timeout_ms=400)) as c:
            time.sleep(1.2)
            assert c.is_open and json.loads(c.coord("echo", "{}"))["method"] == "echo"


# ---- a worker is not a coordinator --------------------------------------------------------


def test_a_worker_refuses_a_coord_req_and_stays_up(tmp_path) -> None:
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=write_secret(tmp_path, SECRET), metrics=False).start()
    try:
        with authed(w.address) as raw:
            raw.send(frame("CoordReq", coord_req("echo", "{}"), stream_id=1))
            h, p = raw.recv_skipping_heartbeats()
            code, message = decode_status(p)
            assert (h["type"], h["stream_id"], code) == ("ErrorRsp", 1, CORRUPTION)
            assert message == "unexpected CoordReq sent to worker w2"
            assert raw.closed_by_peer()
        # the client call fails with that error instead of waiting for its timeout
        with closing(_core.StateClient.connect(w.address, SECRET, request_timeout_ms=60000)) as c:
            t0 = time.monotonic()
            with pytest.raises(rhino.CorruptionError, match="unexpected CoordReq sent to worker w2"):
                c.coord("echo", "{}")
            assert time.monotonic() - t0 < 10
        assert w.alive()
        with closing(_core.StateClient.connect(w.address, SECRET)) as c:
            assert json.loads(c.instance("list", "", 0, 0)) is not None
    finally:
        assert w.alive(), "the worker died"
        w.stop()


# ---- handler threads and close --------------------------------------------------------------


def test_a_slow_handler_does_not_hold_the_others(handler) -> None:
    with _core.CoordServer("127.0.0.1", 0, SECRET, handler, threads=2) as s, \
            closing(_core.StateClient.connect(s.address, SECRET)) as c, ThreadPoolExecutor(1) as pool:
        slow = pool.submit(c.coord, "slow", '{"s": 3.0}')
        wait_for(lambda: s.metrics()["handlers_running"] == 1)
        for i in range(20):  # on the same connection as the slow call, one after the other
            assert json.loads(c.coord("echo", json.dumps({"i": i})))["args"] == {"i": i}
        # all answered while the slow one still runs (were they behind it, it would be done)
        assert not slow.done()
        assert json.loads(slow.result(timeout=10)) == {"slept": 3.0, "tag": None}


def test_close_while_a_handler_runs_lets_it_finish_and_refuses_the_queued(handler) -> None:
    s = _core.CoordServer("127.0.0.1", 0, SECRET, handler, threads=1)
    c = _core.StateClient.connect(s.address, SECRET)
    outcomes: dict[str, object] = {}

    def call(name: str, args: str) -> None:
        try:
            outcomes[name] = c.coord("slow", args)
        except Exception as e:  # noqa: BLE001 - the outcome is the test's to judge
            outcomes[name] = e

    running = threading.Thread(target=call, args=("running", '{"s": 1.0, "tag": "a"}'))
    running.start()
    wait_for(lambda: s.metrics()["handlers_running"] == 1)
    queued = threading.Thread(target=call, args=("queued", '{"s": 1.0, "tag": "b"}'))
    queued.start()
    wait_for(lambda: s.metrics()["requests_queued"] == 1)
    # close() waits for the running handler, which needs the GIL to finish:
    # from another thread with a deadline, so that a close holding the GIL
    # fails the test instead of hanging it.
    t0 = time.monotonic()
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(timeout=20)
    assert not closer.is_alive(), "close() did not return: deadlock?"
    elapsed = time.monotonic() - t0
    assert 0.5 < elapsed < 10
    running.join(timeout=10)
    queued.join(timeout=10)
    assert outcomes["running"] == json.dumps({"slept": 1.0, "tag": "a"})
    assert isinstance(outcomes["queued"], rhino.AbortedError), outcomes["queued"]
    assert "is shutting down" in str(outcomes["queued"])
    assert handler.calls == 1  # the queued request never reached the handler
    # the connection was closed with a reason, which later calls report
    with pytest.raises(rhino.RhinoError, match="shutting down"):
        c.coord("echo", "{}")
    m = s.metrics()
    assert m["requests_refused"] == 1 and m["handlers_running"] == 0 and s.closed
    s.close()  # idempotent
    c.close()
    with pytest.raises(rhino.RhinoError):
        _core.StateClient.connect(s.address, SECRET, peer_timeout_ms=500)


EXIT_SCRIPT = textwrap.dedent("""
    import os, sys, threading, time
    sys.path.insert(0, sys.argv[1])  # tests/, for dataplane_wire
    from dataplane_wire import RawClient, coord_req, frame
    from rhino import _core

    secret = os.environb[b"RHINO_TEST_SECRET"]
    started = threading.Event()

    def handler(method, args):
        started.set()
        time.sleep(0.5)
        sys.stdout.write("handler done\\n")
        sys.stdout.flush()
        return 0, "", "{}"

    s = _core.CoordServer("127.0.0.1", 0, secret, handler)
    raw = RawClient(s.address)  # a client with no thread of its own in this process
    raw.handshake(secret)
    raw.send(frame("CoordReq", coord_req("slow", "{}"), stream_id=1))
    started.wait(10)
    sys.stdout.write("exiting\\n")
    sys.stdout.flush()
    # no close(): the interpreter exits while the handler runs
""")


def test_interpreter_exit_with_a_handler_running_is_clean() -> None:
    env = dict(os.environ, RHINO_TEST_SECRET=SECRET.decode())
    p = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(REPO / "tests")], env=env, capture_output=True,
                       timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().split() == ["exiting", "handler", "done"]


def test_closing_with_the_context_manager_and_dropping_the_server(handler) -> None:
    with _core.CoordServer("127.0.0.1", 0, SECRET, handler) as s:
        address = s.address
        with closing(_core.StateClient.connect(address, SECRET)) as c:
            c.coord("echo", "{}")
    assert s.closed and s.metrics()["requests"] == 1
    with pytest.raises(rhino.RhinoError):
        _core.StateClient.connect(address, SECRET, peer_timeout_ms=500)
    # a server dropped without close() is closed by its destructor
    s2 = _core.CoordServer("127.0.0.1", 0, SECRET, handler)
    address = s2.address
    del s2
    with pytest.raises(rhino.RhinoError):
        _core.StateClient.connect(address, SECRET, peer_timeout_ms=500)

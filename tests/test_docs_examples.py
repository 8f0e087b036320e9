"""The Python examples of docs/python-api.md run as written (docs that match the code).

Every ```python block of the page is run by one of the tests below (the first
test checks that none is left out). The blocks keep their text: the tests only
move the page's paths under tmp_path and replace its addresses with those of
real `rhino worker` processes on 127.0.0.2, .3 (and .4) and of a real
`rhino coordinator`. A docs edit that breaks an example fails here.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import rhino
from rhino.coordinator import connect_coordinator
from rhino_testing.harness.workers import SECRET, CoordinatorProcess, WorkerProcess, write_secret

DOC = Path(__file__).resolve().parent.parent / "docs" / "python-api.md"

# The page's sections with examples, and how many ```python blocks each holds.
STATE, REPLICATION = "State, checkpoints and restores", "Replicating checkpoints to other workers"
SERVICE, COORDINATOR = "The state service: sessions on a worker", "The coordinator: placement, failover, handovers"
EXAMPLES = {STATE: 1, REPLICATION: 1, SERVICE: 2, COORDINATOR: 1}


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _section(heading: str) -> list[str]:
    """The ```python blocks of the page's section `## heading` (up to the next `## `)."""
    text = DOC.read_text()
    part = text[text.index(f"\n## {heading}\n"):]
    part = part[: part.index("\n## ", 1)] if "\n## " in part[1:] else part
    blocks = _python_blocks(part)
    assert len(blocks) == EXAMPLES[heading], f"section {heading!r}: {len(blocks)} python blocks"
    return blocks


def _workers(root: Path, numbers: tuple[int, ...], **kw) -> list[WorkerProcess]:
    secret_file = write_secret(root, SECRET)
    return [WorkerProcess(root, f"w{i}", f"127.0.0.{i}", secret_file=secret_file, metrics=False, **kw).start()
            for i in numbers]


def test_every_python_example_is_run():
    assert len(_python_blocks(DOC.read_text())) == sum(EXAMPLES.values()), \
        "a ```python block of docs/python-api.md that no test runs: add it to EXAMPLES and run it"


def test_state_and_replication_examples_run(tmp_path: Path, monkeypatch):
    """The state example, then the replication example, in one namespace (the
    second replicates the first's checkpoint), against two real workers."""
    (api,), (replication,) = _section(STATE), _section(REPLICATION)
    root = tmp_path / "w"
    root.mkdir()
    workers = _workers(root, (2, 3))
    try:
        data = tmp_path / "data"
        data.mkdir()
        api = api.replace("/data/rhino/", f"{data}/")
        # The replication block runs "on the replica's host": its paths are that worker's.
        replication = (replication.replace('"/data/rhino/w2"', repr(str(workers[0].dir)))
                       .replace('"/data/rhino/q8-0"', repr(str(tmp_path / "replica-host-q8-0")))
                       .replace("127.0.0.2:7000", workers[0].address)
                       .replace("127.0.0.3:7000", workers[1].address))
        assert "/data/rhino" not in api + replication, "a docs path the test does not map"
        monkeypatch.chdir(root)  # open("secret") reads the workers' secret file
        assert Path("secret").read_bytes().strip() == SECRET.strip()

        ns: dict = {}
        # The state block ends with a call the page says raises UnknownVnodeError.
        *body, last = api.rstrip().splitlines()
        assert "UnknownVnodeError" in last
        exec(compile("\n".join(body), "docs/python-api.md (state)", "exec"), ns)
        with pytest.raises(rhino.UnknownVnodeError):
            exec(compile(last, "docs/python-api.md (state, last line)", "exec"), ns)

        exec(compile(replication, "docs/python-api.md (replication)", "exec"), ns)
        restored = ns["db"]
        assert restored.version == 2  # the replica's hard-link restore has the primary's state
        original = ns["restored"]
        keys = ns["mine"]
        assert restored.get_batch(keys[:2000]) == original.get_batch(keys[:2000])
        restored.close()
        original.close()
        ns["db"] = None
    finally:
        for w in workers:
            w.stop()


def test_state_service_example_runs(tmp_path: Path, monkeypatch):
    """The state service's examples (a session, then a checkpoint reader on the
    replica) run as written, against two real workers (the page's socket path
    and replica address mapped)."""
    code = "\n".join(_section(SERVICE))
    root = tmp_path / "w"
    root.mkdir()
    workers = _workers(root, (2, 3))
    try:
        code = (code.replace('"/data/rhino/w2/worker.sock"', repr(str(workers[0].unix_socket)))
                .replace("127.0.0.3:7000", workers[1].address))
        assert "/data/rhino" not in code and "7000" not in code, "a docs address the test does not map"
        monkeypatch.chdir(root)
        ns: dict = {}
        exec(compile(code, "docs/python-api.md (state service)", "exec"), ns)
        assert ns["result"].replication == "complete" and ns["result"].version == 0
        assert ns["n"] > 0
        assert ns["r"].checkpoint == 0 and len(ns["r"].vnodes) == 256 and not ns["r"].open
        assert not list((workers[1].state_dir / "tmp").glob("read-*"))  # the reader's directory went with it
        assert ns["first_vnode"] and all(v == bytes(16) for _, v in ns["first_vnode"])
        # The session of batch 1 was not committed: the worker is still at version 0.
        assert [i["version"] for i in ns["client"].instances()] == [0]
        assert rhino.ReplicaStore(str(workers[1].dir)).checkpoints("q8", 0) == [0]
        ns["client"].close()
    finally:
        for w in workers:
            w.stop()


def test_coordinator_example_runs(tmp_path: Path, monkeypatch):
    """The coordinator's example runs as written against a real coordinator
    and three real workers registered with it (replicas=2 needs three)."""
    (code,) = _section(COORDINATOR)
    root = tmp_path / "w"
    root.mkdir()
    coord = CoordinatorProcess(root, secret_file=write_secret(root, SECRET), heartbeat_timeout=2.0).start()
    workers = []
    try:
        workers = _workers(root, (2, 3, 4), extra_args=["--coordinator", coord.address])
        assert "127.0.0.1:7070" in code
        code = code.replace("127.0.0.1:7070", coord.address)
        monkeypatch.chdir(root)
        cc = connect_coordinator(coord.address, secret=SECRET)
        deadline = time.monotonic() + 20
        while sum(w["state"] == "alive" for w in cc.status()["workers"]) < 3:
            assert time.monotonic() < deadline, "workers did not register"
            time.sleep(0.1)
        ns: dict = {}
        exec(compile(code, "docs/python-api.md (coordinator)", "exec"), ns)
        placement = ns["placement"]
        assert placement.instance_order() == [0, 1, 2, 3] and placement.epoch == 1
        assert cc.placement("q8").last_batch == 0  # the example's commit_batch completed batch 0
        cc.close()
        ns["coord"].close()
    finally:
        for w in workers:
            w.stop()
        coord.stop()

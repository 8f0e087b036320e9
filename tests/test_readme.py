"""The README's Python examples run as written (docs that match the code).

The two ```python blocks of "## Python API" run in one namespace, with the
README's paths moved under tmp_path and its worker addresses replaced by two
real `rhino worker` processes on 127.0.0.2 and 127.0.0.3. Only those strings
change; a README edit that breaks an example fails here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import rhino
from rhino_bench.harness.workers import SECRET, WorkerProcess, write_secret

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    text = README.read_text()
    api = text[text.index("## Python API"):]
    api = api[: api.index("\n## ", 1)]  # up to the next top-level section
    return re.findall(r"```python\n(.*?)```", api, flags=re.S)


def test_readme_python_examples_run(tmp_path: Path, monkeypatch):
    blocks = _python_blocks()
    assert len(blocks) == 2, "expected the API example and the replication example"
    api, replication = blocks

    root = tmp_path / "w"
    root.mkdir()
    secret_file = write_secret(root, SECRET)
    workers = [WorkerProcess(root, f"w{i}", f"127.0.0.{i}", secret_file=secret_file, metrics=False).start()
               for i in (2, 3)]
    try:
        data = tmp_path / "data"
        data.mkdir()
        api = api.replace("/data/rhino/", f"{data}/")
        # The replication block runs "on the replica's host": its paths are that worker's.
        replication = (replication.replace('"/data/rhino/w2"', repr(str(workers[0].dir)))
                       .replace('"/data/rhino/q8-0"', repr(str(tmp_path / "replica-host-q8-0")))
                       .replace("127.0.0.2:7000", workers[0].address)
                       .replace("127.0.0.3:7000", workers[1].address))
        assert "/data/rhino" not in api + replication, "a README path the test does not map"
        monkeypatch.chdir(root)  # open("secret") reads the workers' secret file
        assert Path("secret").read_bytes().strip() == SECRET.strip()

        ns: dict = {}
        # The API block ends with a call the README says raises UnknownVnodeError.
        *body, last = api.rstrip().splitlines()
        assert "UnknownVnodeError" in last
        exec(compile("\n".join(body), "README.md (Python API)", "exec"), ns)
        with pytest.raises(rhino.UnknownVnodeError):
            exec(compile(last, "README.md (Python API, last line)", "exec"), ns)

        exec(compile(replication, "README.md (replication)", "exec"), ns)
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


def test_readme_state_service_example_runs(tmp_path: Path, monkeypatch):
    """The ```python block of "## The state service" runs as written, against
    two real workers (the README's socket path and replica address mapped)."""
    text = README.read_text()
    part = text[text.index("## The state service"):]
    part = part[: part.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", part, flags=re.S)
    assert len(blocks) == 1
    root = tmp_path / "w"
    root.mkdir()
    secret_file = write_secret(root, SECRET)
    workers = [WorkerProcess(root, f"w{i}", f"127.0.0.{i}", secret_file=secret_file, metrics=False).start()
               for i in (2, 3)]
    try:
        code = (blocks[0].replace('"/data/rhino/w2/worker.sock"', repr(str(workers[0].unix_socket)))
                .replace("127.0.0.3:7000", workers[1].address))
        assert "/data/rhino" not in code and "7000" not in code, "a README address the test does not map"
        monkeypatch.chdir(root)
        ns: dict = {}
        exec(compile(code, "README.md (state service)", "exec"), ns)
        assert ns["result"].replication == "complete" and ns["result"].version == 0
        assert ns["n"] > 0
        # The session of batch 1 was not committed: the worker is still at version 0.
        assert [i["version"] for i in ns["client"].instances()] == [0]
        assert rhino.ReplicaStore(str(workers[1].dir)).checkpoints("q8", 0) == [0]
        ns["client"].close()
    finally:
        for w in workers:
            w.stop()

"""Credentials (docs/protocol.md §2, "Roles"): the derived keys against Python's own
hmac (an independent implementation of the documented formula), credential files,
`rhino credential`, and the coordinator's role table, method by method.

The refusals on real workers and a real coordinator are tests/test_abuse.py."""

from __future__ import annotations

import hashlib
import hmac
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import rhino
from rhino import _core
from rhino.coordinator.api import METHODS, authorize
from rhino.credential import Credential, credential_args, parse_credential, write_credential_file
from rhino.errors import InvalidArgumentError, PermissionDeniedError
from rhino.replication import read_secret_file

ROOT = b"the-cluster-root-secret"


def _doc_key(root: bytes, role: str, scope: str) -> bytes:
    return hmac.new(root, b"rhino-credential\0" + role.encode() + b"\0" + scope.encode(), hashlib.sha256).digest()


@pytest.mark.parametrize("role,scope", [("admin", ""), ("coordinator", ""), ("worker", "w1"), ("task", ""),
                                        ("task", "jobA")])
def test_keys_are_the_documented_hmac(role, scope):
    assert _core.credential_key(ROOT, role, scope) == _doc_key(ROOT, role, scope)
    assert Credential.derive(ROOT, role, scope).key == _doc_key(ROOT, role, scope)


def test_bad_roles_and_scopes_are_refused():
    for role, scope in [("root", ""), ("admin", "x"), ("task", "a..b"), ("task", "a b"), ("worker", "")]:
        with pytest.raises(InvalidArgumentError):
            Credential.derive(ROOT, role, scope)
    with pytest.raises(TypeError):
        Credential.derive(Credential.task(ROOT, "a"), "task", "b")  # only the root derives


def test_a_credential_never_shows_its_key():
    c = Credential.task(ROOT, "jobA")
    assert c.key.hex() not in repr(c) and c.key.hex() not in str(c)
    assert repr(c) == "Credential(role='task', scope='jobA')"
    assert Credential.task(ROOT) == Credential.task(ROOT, None) == Credential("task", "", _doc_key(ROOT, "task", ""))


def test_credential_files_round_trip_owner_only(tmp_path: Path):
    c = Credential.task(ROOT, "jobA")
    path = tmp_path / "jobA.credential"
    write_credential_file(path, c)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_secret_file(path) == c
    (tmp_path / "root").write_bytes(ROOT + b"\n")
    assert read_secret_file(tmp_path / "root") == ROOT  # a root secret file is as before


@pytest.mark.parametrize("text", [
    b"rhino-credential 1\nrole=task\nscope=\n",                      # no key
    b"rhino-credential 1\nrole=god\nscope=\nkey=" + b"00" * 32,     # no such role
    b"rhino-credential 1\nrole=task\nscope=\nkey=zz",                # not hex
    b"rhino-credential 1\nrole=task\nscope=\nkey=" + b"00" * 31,    # 31 bytes
    b"rhino-credential 1\nrole=task\nrole=admin\nscope=\nkey=" + b"00" * 32,
])
def test_malformed_credential_files_are_refused(tmp_path: Path, text: bytes):
    with pytest.raises(ValueError):
        parse_credential(text)
    (tmp_path / "c").write_bytes(text)
    with pytest.raises(ValueError, match=str(tmp_path / "c")):
        read_secret_file(tmp_path / "c")


def test_client_arguments_of_a_root_and_of_a_credential():
    assert credential_args(ROOT, "coordinator") == {"secret": ROOT, "role": "coordinator", "scope": "",
                                                    "derived": False}
    c = Credential.task(ROOT, "jobA")
    # a credential proves its own role, whatever role the caller's default names
    assert credential_args(c, "admin") == {"secret": c.key, "role": "task", "scope": "jobA", "derived": True}


def test_rhino_credential_writes_a_task_credential(tmp_path: Path):
    (tmp_path / "root").write_bytes(ROOT)
    out = tmp_path / "job.credential"
    cli = [sys.executable, "-m", "rhino", "credential"]
    r = subprocess.run(cli + ["task", "--namespace", "jobA", "--secret-file", str(tmp_path / "root"),
                              "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert read_secret_file(out) == Credential.task(ROOT, "jobA")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    again = subprocess.run(cli + ["task", "--secret-file", str(tmp_path / "root"), "--out", str(out)],
                           capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr  # never overwritten silently
    from_cred = subprocess.run(cli + ["task", "--secret-file", str(out), "--out", str(tmp_path / "x")],
                               capture_output=True, text=True)
    assert from_cred.returncode != 0 and "root" in from_cred.stderr  # a credential derives nothing


# ---- the coordinator's table (rhino/coordinator/api.py; docs/protocol.md §2 "Roles") ---------

JOB_METHODS = {"create_operator", "placement", "begin_batch", "commit_batch", "report_unreachable", "state_schema",
               "set_state_schema"}


def test_every_method_has_the_documented_roles():
    for name, m in METHODS.items():
        if name in ("register", "heartbeat"):
            assert m.roles == {"admin", "worker"}, name
        elif name in JOB_METHODS:
            assert m.roles == {"admin", "task"}, name
        elif name == "status":
            assert m.roles == {"admin", "coordinator", "worker", "task"}
        else:
            assert m.roles == {"admin"}, name


def test_a_task_calls_its_own_namespace_only():
    authorize("begin_batch", {"operator_id": "jobA..counts", "batch": 1}, "task", "jobA")
    authorize("placement", {"operator_id": "counts"}, "task", "")
    for op in ("jobB..counts", "counts", "jobAB..counts", None, 7):
        with pytest.raises(PermissionDeniedError, match="own namespace"):
            authorize("begin_batch", {"operator_id": op, "batch": 1}, "task", "jobA")
    with pytest.raises(PermissionDeniedError):
        authorize("placement", {"operator_id": "jobA..counts"}, "task", "")
    for method in ("declare_dead", "rescale", "drop_operator", "register", "handover", "autoscale"):
        with pytest.raises(PermissionDeniedError, match=method):
            authorize(method, {"operator_id": "jobA..counts", "worker_id": "w1"}, "task", "jobA")


def test_status_is_for_every_role_whatever_its_scope():
    for role, scope in (("task", "jobA"), ("task", ""), ("worker", "w1"), ("coordinator", ""), ("admin", "")):
        authorize("status", {}, role, scope)


def test_a_worker_registers_as_itself_only():
    authorize("register", {"worker_id": "w1", "address": "127.0.0.2:1"}, "worker", "w1")
    authorize("heartbeat", {"worker_id": "w1", "incarnation": "x"}, "worker", "w1")
    with pytest.raises(PermissionDeniedError, match="own id"):
        authorize("register", {"worker_id": "w2", "address": "127.0.0.2:1"}, "worker", "w1")
    with pytest.raises(PermissionDeniedError):
        authorize("begin_batch", {"operator_id": "op", "batch": 0}, "worker", "w1")
    with pytest.raises(PermissionDeniedError):
        authorize("declare_dead", {"worker_id": "w2"}, "worker", "w1")
    authorize("declare_dead", {"worker_id": "w2"}, "admin", "")


def test_the_error_is_exported_and_maps_to_its_code():
    assert rhino.PermissionDeniedError is PermissionDeniedError
    assert issubclass(PermissionDeniedError, PermissionError)
    assert (19, "PermissionDenied", "PermissionDeniedError") in [tuple(r) for r in _core.status_codes()]

"""Credentials: the role a client proves to a worker or the coordinator
(docs/protocol.md §2, "Roles"; issue 46).

The cluster's root secret (``--secret-file``) admits any role, so only the
processes the cluster trusts hold it: workers, the coordinator and its admin.
Everyone else gets a :class:`Credential`, one role's key derived from the root:

- ``admin``: the CLI; every request;
- ``coordinator``: the control plane's requests to workers;
- ``worker``: chain replication, and registering as its own id (its scope);
- ``task``: a Spark job's driver and tasks, for the operators of one namespace
  (its scope; ``""`` is the default namespace) only.

A Spark task is handed its job's task credential, never the root, so user code
in a task can do no more than its job may::

    cred = Credential.task(root_secret, namespace="jobA")
    write_credential_file("/etc/rhino/jobA.credential", cred)   # rhino credential task --namespace jobA

Anything that takes ``secret=`` takes a Credential instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from . import _core

__all__ = ["Credential", "ROLES", "write_credential_file", "parse_credential", "credential_args"]

ROLES = ("admin", "coordinator", "worker", "task")
_HEADER = "rhino-credential 1"


@dataclass(frozen=True)
class Credential:
    """One role's key: ``role``, its ``scope`` (a task's namespace, a worker's id,
    else ``""``) and the ``key`` it proves (32 bytes, never shown)."""

    role: str
    scope: str
    key: bytes

    def __repr__(self) -> str:  # never the key
        return f"Credential(role={self.role!r}, scope={self.scope!r})"

    @classmethod
    def derive(cls, root: Any, role: str, scope: str = "") -> "Credential":
        """The credential of ``role`` with ``scope``, from the cluster's root secret;
        InvalidArgumentError for an unknown role or a scope that does not fit it."""
        from ._secret import secret_bytes

        if isinstance(root, Credential):
            raise TypeError("derive a credential from the cluster's root secret, not from another credential")
        return cls(role, scope, _core.credential_key(secret_bytes(root), role, scope))

    @classmethod
    def task(cls, root: Any, namespace: Optional[str] = None) -> "Credential":
        """A Spark job's credential: sessions, readers and batch calls for the operators
        of ``namespace`` (None: the default namespace) only."""
        return cls.derive(root, "task", namespace or "")

    def to_text(self) -> str:
        return f"{_HEADER}\nrole={self.role}\nscope={self.scope}\nkey={self.key.hex()}\n"


def parse_credential(text: bytes) -> Optional[Credential]:
    """The Credential a credential file holds, or None if ``text`` is not one (a
    root secret file); ValueError for a credential file that is malformed."""
    if not text.startswith(_HEADER.encode()):
        return None
    fields: dict[str, str] = {}
    for line in text.decode("ascii", errors="replace").splitlines()[1:]:
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep or name not in ("role", "scope", "key") or name in fields:
            raise ValueError(f"a credential file has 'role=', 'scope=' and 'key=' lines once each, not {line[:40]!r}")
        fields[name] = value.strip()
    if set(fields) != {"role", "scope", "key"} or fields["role"] not in ROLES:
        raise ValueError(f"a credential file names one of the roles {', '.join(ROLES)}, a scope and a key")
    try:
        key = bytes.fromhex(fields["key"])
    except ValueError:
        raise ValueError("a credential file's key is hexadecimal") from None
    if len(key) != 32:
        raise ValueError(f"a credential's key is 32 bytes, not {len(key)}")
    return Credential(fields["role"], fields["scope"], key)


def write_credential_file(path: str | os.PathLike[str], credential: Credential) -> None:
    """Writes ``credential`` to ``path``, owner-only (0600) from the start."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(credential.to_text())
    os.chmod(path, 0o600)


def credential_args(secret: Any, role: str = "admin", scope: str = "") -> dict[str, Any]:
    """The ``secret``, ``role``, ``scope`` and ``derived`` arguments of the ``_core``
    clients: a Credential's own, or the root secret's, proving ``role`` with ``scope``."""
    from ._secret import secret_bytes

    if isinstance(secret, Credential):
        return {"secret": secret.key, "role": secret.role, "scope": secret.scope, "derived": True}
    return {"secret": secret_bytes(secret), "role": role, "scope": scope, "derived": False}

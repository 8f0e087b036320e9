"""Operator names and namespaces (issue 45).

An operator is named within a **namespace**, a job's or an application's id chosen
by its user, so that two jobs can both have an operator ``counts``. The default
namespace (``None``) is the global one of before: there the operator's id is its
name, unchanged. Elsewhere the id is ``<namespace>..<name>``.

That id is what the coordinator keys its metadata by and what every worker names the
instance's directories after (docs/protocol.md §3: ``[A-Za-z0-9_.-]{1,128}``, no
leading ``.``), so it stays a plain directory name:

- a namespace is ``[A-Za-z0-9_-]{1,64}`` (no ``.``);
- a name is an operator id without ``..`` (the separator is reserved);
- the whole id is at most 128 bytes.

So an id splits back one way only: the first ``..`` ends the namespace, and an id
without one is in the default namespace.
"""

from __future__ import annotations

import re
from typing import Optional

from ..errors import InvalidArgumentError

__all__ = ["operator_id", "split_operator_id", "check_operator_id", "MAX_OPERATOR_ID_BYTES", "SEPARATOR"]

MAX_OPERATOR_ID_BYTES = 128  # kMaxOperatorIdBytes (rhino/service_messages.h), IsValidOperatorId
SEPARATOR = ".."
_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _ID.fullmatch(name) or name.startswith("."):
        raise InvalidArgumentError(f"operator name {name!r} must be 1 to 128 of [A-Za-z0-9_.-], "
                                   "not starting with '.'")
    if SEPARATOR in name:
        raise InvalidArgumentError(f"operator name {name!r} must not contain '..' (it separates a namespace "
                                   "from the name)")
    return name


def _check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise InvalidArgumentError(f"namespace {namespace!r} must be 1 to 64 of [A-Za-z0-9_-] (no '.')")
    return namespace


def operator_id(name: str, namespace: Optional[str] = None) -> str:
    """The id of operator ``name`` in ``namespace`` (None: the default namespace,
    where the id is the name); InvalidArgumentError naming what is wrong."""
    _check_name(name)
    if namespace is None:
        return name
    out = f"{_check_namespace(namespace)}{SEPARATOR}{name}"
    if len(out) > MAX_OPERATOR_ID_BYTES:
        raise InvalidArgumentError(f"namespace {namespace!r} and operator name {name!r} make an id of {len(out)} "
                                   f"bytes (namespace + 2 + name), over {MAX_OPERATOR_ID_BYTES}")
    return out


def split_operator_id(op_id: str) -> tuple[Optional[str], str]:
    """``(namespace, name)`` of an operator id (namespace None: the default one)."""
    if not isinstance(op_id, str):
        raise InvalidArgumentError(f"operator id must be a string, not {type(op_id).__name__}")
    if SEPARATOR not in op_id:
        return None, _check_name(op_id)
    ns, name = op_id.split(SEPARATOR, 1)
    return _check_namespace(ns), _check_name(name)


def check_operator_id(op_id: str) -> str:
    """``op_id`` if it is an operator id :func:`operator_id` can make, else
    InvalidArgumentError."""
    ns, name = split_operator_id(op_id)
    if operator_id(name, ns) != op_id:  # pragma: no cover - split and join are inverse
        raise InvalidArgumentError(f"operator id {op_id!r} is not canonical")
    return op_id

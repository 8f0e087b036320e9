"""``rhino credential ROLE --secret-file ROOT --out FILE [--namespace NS | --worker-id ID]``:
writes one role's credential, derived from the cluster's root secret (docs/protocol.md §2,
"Roles"), to an owner-only file. A Spark job gets ``rhino credential task --namespace NS``:
its driver and tasks then hold that job's key only, never the root."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rhino credential", description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("role", choices=["task", "worker", "coordinator", "admin"],
                        help="task: a Spark job's driver and tasks; worker: one rhino worker; coordinator; admin")
    parser.add_argument("--secret-file", required=True, help="the cluster's root secret")
    parser.add_argument("--out", required=True, help="the credential file to write (owner-only; an existing file "
                                                     "is refused unless --force)")
    parser.add_argument("--namespace", default=None,
                        help="task: the job's namespace (rhino.spark's namespace=; default: the default namespace)")
    parser.add_argument("--worker-id", default=None, help="worker: its --id")
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from ..credential import Credential, write_credential_file
    from ..errors import InvalidArgumentError
    from ..replication import read_secret_file

    if args.namespace is not None and args.role != "task":
        raise InvalidArgumentError("--namespace is for the task role only")
    if (args.worker_id is not None) != (args.role == "worker"):
        raise InvalidArgumentError("the worker role needs --worker-id, and only it takes one")
    root = read_secret_file(args.secret_file)
    if isinstance(root, Credential):
        raise InvalidArgumentError(f"{args.secret_file} holds a {root.role} credential, not the cluster's root "
                                   "secret: a credential is derived from the root only")
    scope = args.namespace or "" if args.role == "task" else (args.worker_id or "")
    cred = Credential.derive(root, args.role, scope)
    if os.path.exists(args.out) and not args.force:
        raise InvalidArgumentError(f"{args.out} exists; pass --force to replace it")
    write_credential_file(args.out, cred)
    print(f"{args.out}: {cred.role} credential" + (f", scope {cred.scope!r}" if cred.scope else ""))
    return 0

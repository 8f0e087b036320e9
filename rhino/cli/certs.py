"""``rhino certs init DIR --hosts H...``: a CA and certificates per host (its
infrastructure's and its Spark tasks'), for trying
mutual TLS out (rhino/tls/certs.py says what is made; docs/deploy.md how to use a
company CA instead)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rhino certs", description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("init", help="make DIR/ca.pem, ca.key and <host>.pem, <host>.key, <host>-task.pem, "
                                    "<host>-task.key per host",
                       description="Makes a self-signed CA in DIR (or signs with the one already there) and, per "
                                   "host, a certificate naming it (an IP address or a DNS name) for both ends "
                                   "of a connection, admitting the roles admin, coordinator and worker (for the "
                                   "rhino worker, the coordinator and the CLI on that host), and <host>-task.pem "
                                   "admitting the role task only (for the Spark executors and driver on that "
                                   "host). Keys are written owner-only. Existing files are kept unless "
                                   "--force, which also makes a new CA (certificates it signed before stop "
                                   "being accepted). For trying TLS out: in production use your company's CA.")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--hosts", nargs="+", required=True, metavar="HOST",
                   help="the hosts' addresses or names, as peers dial them (e.g. 127.0.0.2 127.0.0.3)")
    p.add_argument("--days", type=int, default=365, help="validity of the CA and the certificates (default 365)")
    p.add_argument("--force", action="store_true", help="replace existing files, the CA included")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from ..tls.certs import init

    files = init(args.dir, args.hosts, days=args.days, force=args.force)
    for name, f in files.items():
        print(f"{name:>16}  {f.cert}  {f.key}")
    return 0

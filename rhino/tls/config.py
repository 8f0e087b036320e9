"""``rhino.TLS``: a host's TLS identity, as every Python entry point takes it.

One value names the three files of docs/protocol.md §2, "TLS": this host's certificate,
its key, and the CA that peers' certificates must chain to. ``None`` (the default
everywhere) is plaintext. The files are read by the C++ core when a worker, a
coordinator or a connection starts, so a bad file fails that start with
:class:`rhino.InvalidArgumentError` naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import InvalidArgumentError

__all__ = ["TLS", "for_host", "tls_kwargs"]


@dataclass(frozen=True)
class TLS:
    """Mutual TLS 1.3 on every TCP link: ``cert`` (PEM, this host's certificate), ``key``
    (PEM, its private key), ``ca`` (PEM, the CA certificate peers must chain to).
    ``rhino certs init DIR --hosts ...`` makes a set to try it out."""

    cert: str
    key: str
    ca: str

    def __post_init__(self) -> None:
        for name in ("cert", "key", "ca"):
            v = getattr(self, name)
            if isinstance(v, os.PathLike):
                object.__setattr__(self, name, os.fspath(v))
            elif not isinstance(v, str) or not v:
                raise InvalidArgumentError(f"TLS needs a {name} file path, got {v!r}")

    @classmethod
    def from_dir(cls, directory: str | os.PathLike, host: str, *, task: bool = False) -> "TLS":
        """The files ``rhino certs init`` made in ``directory`` for ``host``: its own
        certificate (roles admin, coordinator, worker), or with ``task`` its Spark tasks'
        (``<host>-task.pem``, role task only: what a ``rhino.spark`` operator is given)."""
        d = os.fspath(directory)
        name = f"{host}-task" if task else host
        return cls(os.path.join(d, f"{name}.pem"), os.path.join(d, f"{name}.key"), os.path.join(d, "ca.pem"))

    @classmethod
    def from_args(cls, cert: Optional[str], key: Optional[str], ca: Optional[str]) -> Optional["TLS"]:
        """From command-line options: all three or none (plaintext); some of them is an error
        naming the missing ones."""
        given = {"--tls-cert": cert, "--tls-key": key, "--tls-ca": ca}
        if not any(given.values()):
            return None
        missing = [k for k, v in given.items() if not v]
        if missing:
            raise InvalidArgumentError(f"TLS needs --tls-cert, --tls-key and --tls-ca together; missing "
                                       f"{', '.join(missing)}")
        return cls(str(cert), str(key), str(ca))

    def as_dict(self) -> dict:
        return {"cert": self.cert, "key": self.key, "ca": self.ca}


def for_host(tls: Optional[Any], host: str) -> Optional[TLS]:
    """``tls`` (a :class:`TLS`, its dict, or None) with ``{host}`` in its paths replaced by
    ``host``: one setting names each host's own files, as a Spark job that runs on many
    hosts needs (``/etc/rhino/{host}-task.pem``; the local cluster's ``certs/{host}-task.pem``)."""
    if tls is None:
        return None
    if isinstance(tls, dict):
        tls = TLS(**tls)
    return TLS(*(p.replace("{host}", host) for p in (tls.cert, tls.key, tls.ca)))


def tls_kwargs(tls: Optional[Any]) -> dict:
    """The ``tls_cert``, ``tls_key``, ``tls_ca`` keyword arguments of the ``_core`` calls.
    ``tls`` is a :class:`TLS`, a dict with its fields (as it travels to Spark tasks), or None."""
    if tls is None:
        return {}
    if isinstance(tls, dict):
        tls = TLS(**tls)
    if not isinstance(tls, TLS):
        raise InvalidArgumentError(f"tls must be a rhino.TLS or None, got {type(tls).__name__}")
    return {"tls_cert": tls.cert, "tls_key": tls.key, "tls_ca": tls.ca}

"""A certificate authority and per-host certificates for trying mutual TLS out
(``rhino certs init DIR --hosts ...``).

For a real deployment use your company's CA instead (docs/deploy.md, "TLS"): every
link wants only a certificate and key per host, and the CA certificate that signed
them. What this module makes is what such a deployment would have:

- ``ca.pem`` / ``ca.key``: a self-signed CA (ECDSA P-256), allowed to sign end
  certificates only (``pathlen=0``);
- ``<host>.pem`` / ``<host>.key`` per host: the host's name as its subject
  alternative name (an IP address for an address, a DNS name otherwise), valid for
  both ends of a connection (``serverAuth`` and ``clientAuth``), since a worker
  accepts connections and opens them (chain replication, bulk copies); it admits the
  roles of the infrastructure on that host, ``admin``, ``coordinator`` and ``worker``
  (URI subject alternative names ``rhino-role:<role>``, docs/protocol.md §2, "TLS");
- ``<host>-task.pem`` / ``<host>-task.key`` per host: the certificate of the Spark
  executors and driver on that host, the same name, ``clientAuth`` only (a task
  never serves), admitting the role ``task`` only: a task that got hold of the root
  secret still cannot act as the coordinator, a worker or the admin with it.

Keys are written owner-only (0600), certificates world-readable. Nothing is
overwritten unless ``force``. Uses the ``cryptography`` package
(``pip install 'rhino-state[tls]'``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from ..errors import InvalidArgumentError

__all__ = ["CertificateFiles", "HOST_ROLES", "ROLES", "ROLE_URI", "TASK_ROLES", "init", "issue", "load_ca"]

# The URI subject alternative name that names a role a certificate admits (one per role)
ROLE_URI = "rhino-role:"
ROLES = ("admin", "coordinator", "worker", "task")
HOST_ROLES = ("admin", "coordinator", "worker")  # <host>.pem: the infrastructure on the host
TASK_ROLES = ("task",)  # <host>-task.pem: its Spark executors and driver
TASK_SUFFIX = "-task"

_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


def _crypto() -> Any:
    try:
        import cryptography.x509
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise InvalidArgumentError("rhino certs needs the 'cryptography' package: "
                                   "pip install 'rhino-state[tls]'") from e
    return cryptography.x509


@dataclass(frozen=True)
class CertificateFiles:
    """A certificate and its key, as paths."""

    cert: Path
    key: Path


def _check_host(host: str) -> Any:
    """The subject alternative name for ``host``: an IP address or a DNS name."""
    from cryptography import x509

    if not isinstance(host, str) or not host:
        raise InvalidArgumentError(f"a host must be a non-empty name or address, got {host!r}")
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not _HOST.match(host) or ".." in host:
        raise InvalidArgumentError(f"{host!r} is neither an IP address nor a DNS name")
    return x509.DNSName(host)


def _write(path: Path, data: bytes, mode: int, force: bool) -> None:
    if path.exists() and not force:
        raise InvalidArgumentError(f"{path} exists; pass force=True (--force) to replace it")
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)  # whatever the umask
    os.replace(tmp, path)


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def load_ca(directory: str | os.PathLike) -> tuple[Any, Any]:
    """The CA certificate and key of ``init``'s directory."""
    _crypto()
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    d = Path(directory)
    try:
        cert = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), password=None)
    except FileNotFoundError as e:
        raise InvalidArgumentError(f"{d} has no CA (ca.pem and ca.key): run 'rhino certs init' first") from e
    except ValueError as e:
        raise InvalidArgumentError(f"{d}: ca.pem or ca.key is not a PEM certificate / key: {e}") from e
    return cert, key


def _make_ca(name: str, days: int) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _role_names(roles: Optional[Iterable[str]]) -> list[Any]:
    """The URI subject alternative names of ``roles`` (None: none, the certificate admits any role)."""
    from cryptography import x509

    if roles is None:
        return []
    roles = list(dict.fromkeys(roles))
    bad = [r for r in roles if r not in ROLES]
    if bad or not roles:
        raise InvalidArgumentError(f"roles must be some of {', '.join(ROLES)} (or None: any role), got {roles!r}")
    return [x509.UniformResourceIdentifier(ROLE_URI + r) for r in roles]


def issue(ca_cert: Any, ca_key: Any, host: str, *, days: int = 365,
          not_before: Optional[dt.datetime] = None, not_after: Optional[dt.datetime] = None,
          roles: Optional[Iterable[str]] = HOST_ROLES) -> tuple[bytes, bytes]:
    """A certificate for ``host`` signed by the CA, and its key, as PEM bytes. ``not_before``
    and ``not_after`` override the validity (a test makes an expired certificate so).
    ``roles``: the roles it admits, as ``rhino-role:<role>`` URI SANs (default: a host's;
    None: none named, so any role: a CA that does not mark roles). A certificate of
    ``task`` only is for clients only (``clientAuth``)."""
    _crypto()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    names = [_check_host(host), *_role_names(roles)]
    client_only = roles is not None and set(roles) == {"task"}
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client_only else [ExtendedKeyUsageOID.SERVER_AUTH,
                                                                     ExtendedKeyUsageOID.CLIENT_AUTH]
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    start = not_before or now - dt.timedelta(minutes=5)
    end = not_after or now + dt.timedelta(days=days)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _cert_pem(cert), _key_pem(key)


def init(directory: str | os.PathLike, hosts: Iterable[str], *, days: int = 365, force: bool = False,
         ca_name: str = "rhino test CA") -> dict[str, CertificateFiles]:
    """Makes ``directory`` with a new CA (unless it already holds one: then new host
    certificates are signed by it) and per host two certificates: ``<host>.pem`` (roles
    admin, coordinator, worker) and ``<host>-task.pem`` (role task). Returns the files by
    host, the task certificate's under ``"<host>-task"``, and the CA's under ``"ca"``."""
    _crypto()
    hosts = list(dict.fromkeys(hosts))
    if not hosts:
        raise InvalidArgumentError("name at least one host (--hosts 127.0.0.2 127.0.0.3 ...)")
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise InvalidArgumentError(f"days must be a positive integer, got {days!r}")
    for h in hosts:
        _check_host(h)
        if h == "ca":
            raise InvalidArgumentError("'ca' is the CA's file name, not a host")
        if h + TASK_SUFFIX in hosts:
            raise InvalidArgumentError(f"{h + TASK_SUFFIX!r} is the file name of {h}'s task certificate, "
                                       f"not another host")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out: dict[str, CertificateFiles] = {}
    if (d / "ca.pem").exists() and (d / "ca.key").exists() and not force:
        ca_cert, ca_key = load_ca(d)
    else:
        ca_cert, ca_key = _make_ca(ca_name, days)
        _write(d / "ca.key", _key_pem(ca_key), 0o600, force)
        _write(d / "ca.pem", _cert_pem(ca_cert), 0o644, force)
    out["ca"] = CertificateFiles(d / "ca.pem", d / "ca.key")
    for h in hosts:
        for name, roles in ((h, HOST_ROLES), (h + TASK_SUFFIX, TASK_ROLES)):
            cert, key = issue(ca_cert, ca_key, h, days=days, roles=roles)
            files = CertificateFiles(d / f"{name}.pem", d / f"{name}.key")
            _write(files.key, key, 0o600, force)
            _write(files.cert, cert, 0o644, force)
            out[name] = files
    return out

"""``rhino certs init`` (rhino/tls/certs.py): the files it makes, checked by an independent
TLS stack, Python's ``ssl`` (OpenSSL) doing a mutual TLS 1.3 handshake over a real socket
pair: a host's certificate is accepted by a peer trusting the CA, and refused with a CA
it does not trust, expired, or naming another host. Each host also gets a task
certificate: the roles each admits are its ``rhino-role:`` URI SANs (docs/protocol.md §2,
"TLS"). Bad input is a clear error, and nothing is overwritten."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import stat
import threading

import pytest

pytest.importorskip("cryptography")

from rhino.cli.certs import main as certs_main  # noqa: E402
from rhino.errors import InvalidArgumentError  # noqa: E402
from rhino.tls.certs import init, issue, load_ca  # noqa: E402


def _ctx(side: int, ca: str, cert: str, key: str) -> ssl.SSLContext:
    c = ssl.SSLContext(side)
    c.minimum_version = ssl.TLSVersion.TLSv1_3
    c.load_cert_chain(cert, key)
    c.load_verify_locations(ca)
    c.verify_mode = ssl.CERT_REQUIRED
    return c


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_name: str) -> tuple[str, str]:
    """Mutual TLS over a socket pair; each side's error (or "") as a string."""
    a, b = socket.socketpair()
    errs = {"server": "", "client": ""}

    def serve() -> None:
        try:
            with server.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError) as e:
            errs["server"] = str(e)

    t = threading.Thread(target=serve)
    t.start()
    try:
        with client.wrap_socket(b, server_hostname=server_name) as s:
            s.sendall(b"x")
            s.recv(1)  # the server's close (TLS 1.3 client auth is checked after the client's Finished)
    except (ssl.SSLError, OSError) as e:
        errs["client"] = str(e)
    t.join(10)
    return errs["server"], errs["client"]


def test_host_certificates_pass_a_mutual_tls_handshake(tmp_path):
    files = init(tmp_path / "c", ["127.0.0.2", "worker-b.example"])
    ca = str(files["ca"].cert)
    a, b = files["127.0.0.2"], files["worker-b.example"]
    srv = _ctx(ssl.PROTOCOL_TLS_SERVER, ca, str(a.cert), str(a.key))
    cli = _ctx(ssl.PROTOCOL_TLS_CLIENT, ca, str(b.cert), str(b.key))
    assert _handshake(srv, cli, "127.0.0.2") == ("", "")
    # the DNS name works as a server's name too
    srv2 = _ctx(ssl.PROTOCOL_TLS_SERVER, ca, str(b.cert), str(b.key))
    cli2 = _ctx(ssl.PROTOCOL_TLS_CLIENT, ca, str(a.cert), str(a.key))
    assert _handshake(srv2, cli2, "worker-b.example") == ("", "")
    # keys owner-only, certificates readable
    for h in ("ca", "127.0.0.2", "worker-b.example"):
        assert stat.S_IMODE(files[h].key.stat().st_mode) == 0o600
        assert stat.S_IMODE(files[h].cert.stat().st_mode) == 0o644


def test_a_wrong_ca_an_expired_certificate_and_another_hosts_name_are_refused(tmp_path):
    good = init(tmp_path / "good", ["127.0.0.2", "127.0.0.3"])
    other = init(tmp_path / "other", ["127.0.0.3"])
    ca = str(good["ca"].cert)
    a = good["127.0.0.2"]
    srv = _ctx(ssl.PROTOCOL_TLS_SERVER, ca, str(a.cert), str(a.key))

    # a client whose certificate another CA signed: the server refuses it
    o = other["127.0.0.3"]
    s_err, _ = _handshake(srv, _ctx(ssl.PROTOCOL_TLS_CLIENT, ca, str(o.cert), str(o.key)), "127.0.0.2")
    assert "certificate verify failed" in s_err or "unknown ca" in s_err.lower()

    # an expired certificate from the right CA
    ca_cert, ca_key = load_ca(tmp_path / "good")
    now = dt.datetime.now(dt.timezone.utc)
    cert, key = issue(ca_cert, ca_key, "127.0.0.3", not_before=now - dt.timedelta(days=10),
                      not_after=now - dt.timedelta(days=1))
    (tmp_path / "old.pem").write_bytes(cert)
    (tmp_path / "old.key").write_bytes(key)
    s_err, _ = _handshake(srv, _ctx(ssl.PROTOCOL_TLS_CLIENT, ca, str(tmp_path / "old.pem"),
                                    str(tmp_path / "old.key")), "127.0.0.2")
    assert "expired" in s_err

    # the server's certificate names 127.0.0.2: a client dialling 127.0.0.3 refuses it
    b = good["127.0.0.3"]
    _, c_err = _handshake(srv, _ctx(ssl.PROTOCOL_TLS_CLIENT, ca, str(b.cert), str(b.key)), "127.0.0.3")
    assert "IP address mismatch" in c_err or "hostname mismatch" in c_err.lower()


def test_init_keeps_the_ca_and_refuses_to_overwrite(tmp_path, capsys):
    d = tmp_path / "c"
    assert certs_main(["init", str(d), "--hosts", "127.0.0.2"]) == 0
    assert "127.0.0.2" in capsys.readouterr().out
    ca_before = (d / "ca.pem").read_bytes()
    # a second host later: signed by the same CA
    assert certs_main(["init", str(d), "--hosts", "127.0.0.4"]) == 0
    assert (d / "ca.pem").read_bytes() == ca_before
    srv = _ctx(ssl.PROTOCOL_TLS_SERVER, str(d / "ca.pem"), str(d / "127.0.0.2.pem"), str(d / "127.0.0.2.key"))
    cli = _ctx(ssl.PROTOCOL_TLS_CLIENT, str(d / "ca.pem"), str(d / "127.0.0.4.pem"), str(d / "127.0.0.4.key"))
    assert _handshake(srv, cli, "127.0.0.2") == ("", "")
    key_before = (d / "127.0.0.2.key").read_bytes()
    with pytest.raises(InvalidArgumentError, match="exists"):
        init(d, ["127.0.0.2"])
    assert (d / "127.0.0.2.key").read_bytes() == key_before
    init(d, ["127.0.0.2"], force=True)  # a new CA and key
    assert (d / "ca.pem").read_bytes() != ca_before and (d / "127.0.0.2.key").read_bytes() != key_before


def _roles_and_usages(path) -> tuple[list[str], set[str]]:
    """The ``rhino-role:`` URI SANs of a certificate, and its extended key usages' names."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    names = {ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth", ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth"}
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    return ([u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith("rhino-role:")],
            {names.get(u, u.dotted_string) for u in eku})


def test_each_host_gets_its_own_and_its_tasks_certificate_with_their_roles(tmp_path, capsys):
    d = tmp_path / "c"
    assert certs_main(["init", str(d), "--hosts", "127.0.0.2"]) == 0
    out = capsys.readouterr().out
    assert "127.0.0.2-task.pem" in out and "127.0.0.2.pem" in out
    # the host's: the infrastructure on it (worker, coordinator, the admin's CLI), both ends
    assert _roles_and_usages(d / "127.0.0.2.pem") == (
        ["rhino-role:admin", "rhino-role:coordinator", "rhino-role:worker"], {"serverAuth", "clientAuth"})
    # its Spark tasks': the task role only, a client only
    assert _roles_and_usages(d / "127.0.0.2-task.pem") == (["rhino-role:task"], {"clientAuth"})
    assert stat.S_IMODE((d / "127.0.0.2-task.key").stat().st_mode) == 0o600
    # the task certificate passes a mutual TLS handshake as a client, and names the host too
    srv = _ctx(ssl.PROTOCOL_TLS_SERVER, str(d / "ca.pem"), str(d / "127.0.0.2.pem"), str(d / "127.0.0.2.key"))
    cli = _ctx(ssl.PROTOCOL_TLS_CLIENT, str(d / "ca.pem"), str(d / "127.0.0.2-task.pem"),
               str(d / "127.0.0.2-task.key"))
    assert _handshake(srv, cli, "127.0.0.2") == ("", "")
    # but it cannot serve: a client refuses it as a server's certificate (no serverAuth)
    srv = _ctx(ssl.PROTOCOL_TLS_SERVER, str(d / "ca.pem"), str(d / "127.0.0.2-task.pem"),
               str(d / "127.0.0.2-task.key"))
    cli = _ctx(ssl.PROTOCOL_TLS_CLIENT, str(d / "ca.pem"), str(d / "127.0.0.2.pem"), str(d / "127.0.0.2.key"))
    _, c_err = _handshake(srv, cli, "127.0.0.2")
    assert "unsupported certificate purpose" in c_err or "certificate verify failed" in c_err, c_err
    # issue(): any roles, or none (a CA that does not mark roles), and nothing else
    ca_cert, ca_key = load_ca(d)
    cert, _ = issue(ca_cert, ca_key, "127.0.0.3", roles=None)
    (tmp_path / "plain.pem").write_bytes(cert)
    assert _roles_and_usages(tmp_path / "plain.pem") == ([], {"serverAuth", "clientAuth"})
    cert, _ = issue(ca_cert, ca_key, "127.0.0.3", roles=["worker"])
    (tmp_path / "w.pem").write_bytes(cert)
    assert _roles_and_usages(tmp_path / "w.pem")[0] == ["rhino-role:worker"]
    for bad in (["root"], [], ["Admin"]):
        with pytest.raises(InvalidArgumentError, match="roles must be some of"):
            issue(ca_cert, ca_key, "127.0.0.3", roles=bad)


@pytest.mark.parametrize("hosts, days, match", [
    ([], 365, "at least one host"),
    (["bad host"], 365, "neither an IP address nor a DNS name"),
    (["a..b"], 365, "neither"),
    (["ca"], 365, "CA's file name"),
    (["w1", "w1-task"], 365, "w1's task certificate"),
    (["127.0.0.2"], 0, "positive integer"),
    (["127.0.0.2"], True, "positive integer"),
])
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, hosts, days, match):
    with pytest.raises(InvalidArgumentError, match=match):
        init(tmp_path / "c", hosts, days=days)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())

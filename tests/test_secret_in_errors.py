"""The calls that take the cluster's shared secret never show it in an error,
and refuse what is not a secret. A pybind11 argument mismatch used to end in
"Invoked with: ..., secret=b'...'", which a Spark executor would log."""

from __future__ import annotations

import pytest

import rhino

SECRET = b"TOPSECRET-do-not-log"


@pytest.mark.parametrize("call", [
    lambda s: rhino.replicate("/nonexistent", "op", -1, 1, ["127.0.0.2:1"], chain_version=1, secret=s),
    lambda s: rhino.replicate("/nonexistent", "op", 0, 1, ["127.0.0.2:1"], chain_version=-2, secret=s),
    lambda s: rhino.query_store("127.0.0.2:1", secret=s, operator_id="op", instance=-1),
    lambda s: rhino.Worker(id="w", store_dir="/nonexistent", secret=s, io_threads=-3),
    lambda s: rhino.Worker(id="w", store_dir="/nonexistent", secret=s, listen_port=70000),
], ids=["replicate-instance", "replicate-chain-version", "query_store", "worker-threads", "worker-port"])
@pytest.mark.parametrize("secret", [SECRET, SECRET.decode()], ids=["bytes", "str"])
def test_a_bad_argument_does_not_show_the_secret(call, secret):
    with pytest.raises(TypeError) as e:
        call(secret)
    assert "incompatible" in str(e.value)  # still says what was wrong
    assert "TOPSECRET" not in str(e.value) and "arguments not shown" in str(e.value)


@pytest.mark.parametrize("secret, error, message", [
    (5, TypeError, "secret must be bytes or str, got int"),  # bytes(5) would be five zero bytes
    (None, TypeError, "secret must be bytes or str, got NoneType"),
    (b"", ValueError, "secret is empty"),
    ("", ValueError, "secret is empty"),
])
def test_what_is_not_a_secret_is_refused(secret, error, message):
    with pytest.raises(error, match=message):
        rhino.replicate("/nonexistent", "op", 0, 1, ["127.0.0.2:1"], chain_version=1, secret=secret)
    with pytest.raises(error, match=message):
        rhino.query_store("127.0.0.2:1", secret=secret, operator_id="op", instance=0)
    with pytest.raises(error, match=message):
        rhino.Worker(id="w", store_dir="/nonexistent", secret=secret)


def test_a_single_string_is_not_a_chain():
    # list("127.0.0.2:7000") would be a chain of one-character "addresses".
    with pytest.raises(TypeError, match="chain must be a list of 'host:port' strings"):
        rhino.replicate("/nonexistent", "op", 0, 1, "127.0.0.2:7000", chain_version=1, secret=SECRET)


def test_the_worker_still_works(tmp_path):
    w = rhino.Worker(id="wsec", store_dir=str(tmp_path / "s"), listen_host="127.0.0.16", secret=SECRET)
    w.start()
    try:
        assert w.port > 0 and w.id == "wsec"
        assert rhino.query_store(f"127.0.0.16:{w.port}", secret=SECRET, operator_id="op", instance=0) == []
        with pytest.raises(rhino.AuthFailedError):
            rhino.query_store(f"127.0.0.16:{w.port}", secret=b"wrong", operator_id="op", instance=0)
    finally:
        w.stop()
        w.join()

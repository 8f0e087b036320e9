"""The shared secret on the Python side: checked, converted to bytes, and kept
out of error messages.

pybind11 answers a call whose arguments do not match with a TypeError that
ends in "Invoked with: ..." and the repr of every argument. For the calls that
take the cluster's secret (replicate, query_store, Worker), that would print
the secret into a Spark executor's log. Those calls go through
`call_hiding_secret`, which keeps the message but not the arguments.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from . import _core

__all__ = ["secret_bytes", "call_hiding_secret", "Worker"]

T = TypeVar("T")


def secret_bytes(secret: Any) -> bytes:
    """bytes (or bytearray, memoryview) as they are, str as UTF-8; anything else is a TypeError.
    (bytes(5) would be five zero bytes: an int must not become a secret.)"""
    if isinstance(secret, str):
        out = secret.encode()
    elif isinstance(secret, (bytes, bytearray, memoryview)):
        out = bytes(secret)
    else:
        raise TypeError(f"secret must be bytes or str, got {type(secret).__name__}")
    if not out:
        raise ValueError("secret is empty")
    return out


def call_hiding_secret(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    except TypeError as e:
        message = str(e)
        cut = message.find("Invoked with:")
        if cut < 0:
            raise
        raise TypeError(message[:cut] + "Invoked with: (arguments not shown: they include the shared secret)") \
            from None


class Worker(_core.Worker):
    """One host's runtime: replica store plus data-plane server (see `rhino worker`).

    The same as ``rhino._core.Worker``, but a bad argument gives a TypeError that
    does not show the shared secret, and the secret is checked like everywhere else.
    """

    def __init__(self, **kwargs: Any) -> None:
        if "secret" in kwargs:
            kwargs["secret"] = secret_bytes(kwargs["secret"])
        if "tls" in kwargs:  # a rhino.TLS (or None): the _core's tls_cert, tls_key, tls_ca
            from .tls.config import tls_kwargs

            kwargs.update(tls_kwargs(kwargs.pop("tls")))
        call_hiding_secret(super().__init__, **kwargs)

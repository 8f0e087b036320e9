"""Mutual TLS on Rhino's TCP links (docs/protocol.md §2, "TLS"): the ``TLS`` value every
entry point takes, and certificates for trying it out (``certs``)."""

from .config import TLS, for_host, tls_kwargs

__all__ = ["TLS", "for_host", "tls_kwargs"]

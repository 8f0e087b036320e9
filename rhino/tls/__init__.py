"""Mutual TLS on Rhino's TCP links: certificates for trying it out (``certs``)."""

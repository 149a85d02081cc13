"""Errors of the ``gateway`` package.

    GatewayError
    ├── ConfigError         the configuration file is wrong: the message names the
    │                       file and the key (config.py)
    └── Problem             an answer to the caller, an RFC 9457 document
                            (problems.py; its code and status in wire.PROBLEMS)

The database's failures reach the gateway as ``leases.Unavailable`` and are
answered 503 by the problem middleware (app.py), in that one place.
``GatewayClient``, for the callers' side, has a tree of its own (client.py).
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every error raised by ``gateway``."""


class ConfigError(GatewayError):
    """The configuration file is wrong; the message says where."""

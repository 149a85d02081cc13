"""What aiohttp's own request parser logs, without what the caller sent.

A request line or header line the parser refuses (a control character in a
header value, a line too long, a bad method) is answered 400 by aiohttp
before any route runs, and ``aiohttp.server`` logs the refusal at ERROR with
the exception, whose message quotes the offending line: an
``Authorization: Bearer <key>\\x7f`` puts the key in the log. The filter
here keeps the record (a refusal, its kind and status, the peer) and drops
the exception and its text. Other records pass unchanged.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

#: the logger aiohttp's server protocol reports errors on
SERVER_LOGGER = "aiohttp.server"


class ParserRefusals(logging.Filter):
    """Rewrites a parser refusal's record to name its kind, not its bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else None
            record.msg = "refused a request the HTTP parser could not read: %s (%s) from %s"
            record.args = (type(exc).__name__, exc.code, peer)
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
        return True


def install() -> None:
    """Put the filter on ``aiohttp.server`` (once, however often called)."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, ParserRefusals) for f in logger.filters):
        logger.addFilter(ParserRefusals())

"""What aiohttp's own request parser logs and answers, without what the
caller sent.

A request line or header line the parser refuses (a control character in a
header value, a line too long, a bad method) is answered 400 by aiohttp
before any route runs, and ``aiohttp.server`` logs the refusal at ERROR with
the exception, whose message quotes the offending line: an
``Authorization: Bearer <key>\\x7f`` puts the key in the log. The filter
here keeps the record (a refusal, its kind and status, the peer) and drops
the exception and its text. Other records pass unchanged.

aiohttp's 400 quotes the same line in its text body. aiohttp has no hook
for that answer (``RequestHandler.handle_error`` builds it from the parser's
message), so ``install`` wraps that method: a parser's refusal is answered
with a problem document (400 ``bad_request``) naming the refusal's kind,
never its bytes. It checks the method is there and takes what it wraps, as
``providers/http.py`` does for aiohttp's request retry.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import HttpProcessingError

from gateway.api.problems import Problem

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


def refusal(exc: HttpProcessingError) -> web.Response:
    """The answer to a request the parser refused: its kind, not its bytes."""
    response = Problem("bad_request", f"the request could not be read as HTTP "
                       f"({type(exc).__name__}); nothing was done").response()
    response.force_close()  # as aiohttp does: the connection's bytes are not trusted
    return response


_WRAPPED = "_fencegate_redacted"
_HANDLE_ERROR_PARAMS = ["self", "request", "status", "exc", "message"]


def _redact_answers() -> None:
    handler = web_protocol.RequestHandler
    original = handler.handle_error
    if getattr(original, _WRAPPED, False):
        return
    if list(inspect.signature(original).parameters) != _HANDLE_ERROR_PARAMS:
        raise RuntimeError("this aiohttp's RequestHandler.handle_error is not the one "
                           "parserlog.py wraps: its 400 may quote a caller's API key")

    @functools.wraps(original)
    def handle_error(self: web_protocol.RequestHandler, request: Any, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status == 400 and isinstance(exc, HttpProcessingError):
            original(self, request, status, exc, None)  # its log record and its checks
            return refusal(exc)
        return original(self, request, status, exc, message)

    setattr(handle_error, _WRAPPED, True)
    handler.handle_error = handle_error  # type: ignore[method-assign]


def install() -> None:
    """Put the filter on ``aiohttp.server``, and make a parser's refusal
    answer without the caller's bytes (once, however often called)."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, ParserRefusals) for f in logger.filters):
        logger.addFilter(ParserRefusals())
    _redact_answers()

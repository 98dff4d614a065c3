"""The daemon's HTTP server: aiohttp's, except for what its protocol answers itself.

A request aiohttp's parser cannot read (a bad method, `HTTP/9.9`, a line over 8190 bytes,
garbage) never reaches the API's handlers or middleware: the protocol answers it through its
own `handle_error`, in plain text, and logs the parser's exception with its traceback (at
error level for any request after a connection's first). Here `handle_error` answers in the
API's shape (`{"error", "detail"}` with the reason's status, as api.error does) and logs a
caller's mistake as one debug line: nothing a caller sends puts a traceback in the log. Only a
bug (an exception that is neither the caller's nor a refusal) is still logged with one.

aiohttp builds its `Server` inside `AppRunner` and names no option for the class of its
connections, so `Runner` gives the server it built the one difference, a `__call__` that makes
our connections.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from sealgate.reasons import Reason, SealgateError

from .api import error
from .portroutes import loggable

_LOG = logging.getLogger("sealgate.sandbox.daemon.api")


class _Connection(web.RequestHandler):
    __slots__ = ()

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """The answer to a request no handler answered: one the parser refused (400), or a
        handler's exception that escaped the API's middleware (an answer already streaming,
        which only closing the connection can end)."""
        if isinstance(exc, HttpProcessingError):  # the parser's: the caller's own bytes
            _LOG.debug("refused a request: %s", exc.message[:200])
            reason, detail = (Reason.TOO_LARGE, "a request line or header over its cap (8190 "
                              "bytes)") if isinstance(exc, LineTooLong) else \
                (Reason.BAD_REQUEST, f"not an HTTP/1.x request: {exc.message}")
        elif isinstance(exc, SealgateError):  # a refusal met once the answer had begun
            reason, detail = exc.reason, str(exc)
            _LOG.warning("%s %s cut short: %s: %s", request.method, loggable(request),
                         reason.value, detail[:200])
        elif isinstance(exc, ConnectionError) or exc is None:  # the caller left; a time-out
            reason, detail = Reason.INTERNAL_ERROR, message or "no answer could be made"
        else:
            _LOG.error("a bug answering %s %s", request.method, loggable(request),
                       exc_info=exc)
            reason, detail = Reason.INTERNAL_ERROR, type(exc).__name__
        if request.writer.output_size > 0:
            # aiohttp's own contract: an answer has begun, so none can follow; this closes
            # the connection, and the caller sees the answer cut.
            raise ConnectionError("the answer had begun")
        response = error(reason, detail[:300])
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """`web.AppRunner` whose connections answer every refusal as the API does."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same server; only the connections it makes differ
        return server

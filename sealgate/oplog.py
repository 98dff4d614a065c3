"""The operational log of every long-running sealgate process (the proxy and its workers, the
issuer, sandboxd, the kube watcher): structlog over the standard library's logging, configured
once per process by `configure`.

The code logs with `logging.getLogger("sealgate...")` and passes context as fields
(`log.warning("secret fetch failed", extra={"ref": ..., "error": ...})`), or with a structlog
logger (`structlog.get_logger(...)`); both end in one handler on the root logger whose
`structlog.stdlib.ProcessorFormatter` writes one line per record: JSON by default, console text
on a terminal or with `--log-format console`. The field names are the audit line's where they
mean the same (`ts`, `event`, `request_id`, `connection_id`, `sandbox`, `policy`, `reason`,
`host`, `error`), plus `level` and `logger`; docs/operations.md, "Log fields", lists them.

The audit log is not written through here: it keeps its own batched, fail-closed writer
(sealgate/audit.py), which must refuse requests when it cannot write, which a log cannot.

What no line may carry, whatever a caller passes by mistake (defence in depth: the callers
already log references and causes, never values): every field named like a credential is
masked whole, and in every string, at any depth, bearer and basic credentials, the password of
a URL's user part (a proxy URL's key), sealed tokens (`sg1.`), PEM private keys and the
prefixes of well-known API keys are masked. An exception is one field, `exception`: its type,
its message (masked the same way) and its frames' file, line and function, never their local
variables, in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import re
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any, Final, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from .clikit import env_option

__all__ = ["ENV", "EVENTS", "FORMATS", "LEVELS", "LEVEL_ENV", "add_flags", "bound", "configure",
           "is_console", "scrub", "scrub_fields"]

FORMATS: Final = ("json", "console")
LEVELS: Final = ("debug", "info", "warning", "error")
ENV: Final = "SEALGATE_LOG_FORMAT"
LEVEL_ENV: Final = "SEALGATE_LOG_LEVEL"
# A logger whose records go to `configure(events=...)`'s stream instead of stderr: sandboxd's
# lifecycle events, JSON lines on stdout (sandbox/daemon/events.py).
EVENTS: Final = "sealgate.events"
MASK: Final = "[redacted]"
_FIRST: Final = ("ts", "level", "event")  # the rest keep the order they were given in
# Field names whose value is masked whole. The audit line's forbidden names, and what a
# credential is called where the code handles one.
_SECRET_FIELDS: Final = frozenset({
    "authorization", "proxy_authorization", "token", "secret", "password", "query", "cookie",
    "api_key", "private_key", "client_secret", "refresh_token", "access_token", "secret_id",
    "jwt", "key",
})
# Record attributes the standard library sets on every record: not fields of the line.
_RECORD_ATTRIBUTES: Final = frozenset(vars(logging.makeLogRecord({})))
_installed: list[tuple[logging.Logger, logging.Handler]] = []
_chosen = {"console": False}  # what `configure` chose for the main stream


def add_flags(parser: argparse.ArgumentParser) -> None:
    """`--log-format` and `--log-level` (and their environment variables), the same on every
    command that serves."""
    env_option(parser, "--log-format", env=ENV, choices=FORMATS, metavar="FORMAT",
               help="operational log lines on stderr: json (the default) or console (the "
                    "default when stderr is a terminal)")
    env_option(parser, "--log-level", env=LEVEL_ENV, choices=LEVELS, default="info",
               metavar="LEVEL", help="the least level logged: debug, info, warning, error "
                                     "(debug: the libraries' records too)")


def configure(fmt: str | None = None, level: str = "info", *, stream: TextIO | None = None,
              events: TextIO | None = None) -> None:
    """Send every log record of this process through one formatter to `stream` (stderr), and
    those of `EVENTS` to `events` when given. `fmt` None picks per stream: console on a
    terminal, JSON otherwise. sealgate's records from `level` up; other libraries' from
    warning up, or from debug at debug. Calling it again replaces what an earlier call
    installed."""
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: one of {', '.join(LEVELS)}")
    for logger, handler in _installed:
        logger.removeHandler(handler)
    _installed.clear()
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level,
                    structlog.stdlib.PositionalArgumentsFormatter(),
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    stream = stream or sys.stderr
    _chosen["console"] = fmt == "console" or (fmt is None and _is_terminal(stream))
    main = _handler(stream, fmt)
    # mitmproxy's own records stay out, as in the lean master before (tests/mitmlog.py shows
    # them to a test): what they report of a flow the audit line says, with its request id.
    main.addFilter(lambda record: not record.name.startswith("mitmproxy"))
    root = logging.getLogger()
    _install(root, main)
    threshold = logging.getLevelName(level.upper())
    logging.getLogger("sealgate").setLevel(threshold)
    root.setLevel(logging.DEBUG if threshold == logging.DEBUG else logging.WARNING)
    # mitmproxy's records are not ours to show, and at debug it would make one per flow event,
    # each formatted and posted to its event loop by its own handler.
    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    events_logger = logging.getLogger(EVENTS)
    events_logger.setLevel(logging.INFO)  # lifecycle events are the daemon's output, always
    events_logger.propagate = events is None
    if events is not None:
        _install(events_logger, _handler(events, fmt))
    logging.captureWarnings(True)
    # The last resort's multi-line traceback would be the one line that is not a line.
    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread


def bound(**fields: Any) -> contextlib.AbstractContextManager[Any]:
    """`fields` on every log line written inside the block, and in the tasks it starts (which
    copy the context): a request's id, sandbox and policy on the lines of what it caused."""
    return structlog.contextvars.bound_contextvars(**fields)


def is_console() -> bool:
    """Whether the log is console text (a person reads it), not JSON lines."""
    return _chosen["console"]


def _install(logger: logging.Logger, handler: logging.Handler) -> None:
    logger.addHandler(handler)
    _installed.append((logger, handler))


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    def handleError(self, record: logging.LogRecord) -> None:
        # A log line that cannot be written (a closed pipe) is dropped: the default prints a
        # traceback to stderr for each, which is where the lines could not go either. Any
        # other failure is a bug of the formatting, shown as the default shows it.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handleError(record)


def _handler(stream: TextIO, fmt: str | None) -> logging.Handler:
    console = fmt == "console" or (fmt is None and _is_terminal(stream))
    renderers: list[Processor] = [
        _exception_text,
        structlog.dev.ConsoleRenderer(colors=False, timestamp_key="ts", sort_keys=False),
    ] if console else [structlog.processors.JSONRenderer(default=str)]
    handler = _Handler(stream)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[_extra],
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _timestamp,
            structlog.processors.ExceptionRenderer(_exception),
            scrub_fields,
            _ordered,
            *renderers,
        ],
    ))
    return handler


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _extra(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """A standard record's `extra=` fields, as fields of the line."""
    record: logging.LogRecord = event["_record"]
    for name, value in vars(record).items():
        if name not in _RECORD_ATTRIBUTES and not name.startswith("_") and name != "message":
            event.setdefault(name, value)
    return event


def _timestamp(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """`ts` as the audit line writes it: ISO 8601, UTC, milliseconds."""
    now = time.time()
    second = int(now)
    event["ts"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)) + \
        f".{int((now - second) * 1000):03d}Z"
    return event


_exception = structlog.tracebacks.ExceptionDictTransformer(
    show_locals=False,  # a frame's locals are where secrets live
    max_frames=30,
)


def _exception_text(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """On a console the exception is one line of text too: each exception's type and message,
    then its innermost frame (the console renderer would print a multi-line traceback)."""
    chain = event.pop("exception", None)
    if isinstance(chain, list):
        parts = []
        for exc in chain:
            frames = exc.get("frames") or [{}]
            last = frames[-1]
            parts.append(f"{exc.get('exc_type')}: {exc.get('exc_value')} "
                         f"({last.get('filename')}:{last.get('lineno')} in {last.get('name')})")
        event["exception_text"] = " <- ".join(parts)
    return event


def _ordered(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    return {**{k: event[k] for k in _FIRST if k in event},
            **{k: v for k, v in event.items() if k not in _FIRST}}


def scrub_fields(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """Every field of the line masked: by its name, and in every string at any depth."""
    return {key: _clean(key, value) for key, value in event.items()}


def _clean(key: str | None, value: Any) -> Any:
    if key is not None and key.lower().replace("-", "_") in _SECRET_FIELDS and value is not None:
        return MASK
    if isinstance(value, str):
        return scrub(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        return {str(k): _clean(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(None, v) for v in value]
    # Anything else is written as its text: scrubbed here, not after (a repr can hold anything).
    return scrub(str(value))


@functools.cache
def _patterns() -> tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...]:
    # Imported here: the token library costs its import only to the processes that log.
    from .credentials.token import TOKEN_PREFIX

    return (
        # PEM private keys, to their end or to the end of the text
        (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(-----END [A-Z0-9 ]*PRIVATE "
                    r"KEY-----|\Z)", re.S), MASK),
        # a header's credential: `Authorization: Bearer x`, `proxy-authorization=x`
        (re.compile(r"(?i)\b((?:proxy-)?authorization)([\"']?\s*[:=]\s*[\"']?)"
                    r"((?:[A-Za-z]+\s+)?[^\s\"',;]+)"), rf"\1\2{MASK}"),
        (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/:=-]{8,}"), rf"\1\2{MASK}"),
        # a URL's password (a proxy URL's key, with the tokens beside it): kept to its user
        (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@\"']*):[^/\s@\"']+@"), rf"\1:{MASK}@"),
        # sealed tokens, well-formed or not (a malformed one is still somebody's secret)
        (re.compile(rf"\b{re.escape(TOKEN_PREFIX)}\.[A-Za-z0-9_.~+/=-]{{8,}}"),
         f"{TOKEN_PREFIX}.{MASK}"),
        # well-known API key prefixes: Vault, GitHub, OpenAI/Anthropic, Stripe, Slack, GitLab
        (re.compile(r"\b(hvs\.|hvb\.|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|sk-|sk_live_|"
                    r"sk_test_|rk_live_|rk_test_|xox[abprs]-|glpat-)[A-Za-z0-9_.-]{8,}"),
         rf"\1{MASK}"),
    )


def scrub(text: str) -> str:
    """`text` with every credential-looking part masked (see the module's docstring)."""
    for pattern, replacement in _patterns():
        text = pattern.sub(replacement, text)
    return text


def _uncaught(kind: type[BaseException], value: BaseException,
              traceback: types.TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, traceback)
        return
    _last_words("uncaught exception", (kind, value, traceback), {})


def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    _last_words("uncaught exception in a thread",
                (args.exc_type, args.exc_value, args.exc_traceback),
                {"thread_name": getattr(args.thread, "name", None)})


def _last_words(message: str, exc_info: Any, extra: dict[str, Any]) -> None:
    """Straight to this module's handlers, not through the loggers: at the end of a process
    another library's handler on the root logger may no longer work (mitmproxy's posts to an
    event loop that is closed by then)."""
    record = logging.getLogger("sealgate").makeRecord(
        "sealgate", logging.CRITICAL, "", 0, message, (), exc_info, extra=extra)
    for _, handler in _installed[:1]:
        handler.handle(record)

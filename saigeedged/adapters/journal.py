"""Owns logging's global state: structlog configured once, and the journald sink (SPEC §9)."""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

IDENTIFIER = "saigeedged"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def journal_field(key: str) -> str:
    """A journal field name: A-Z0-9_, no leading digit or underscore, at most 64 characters."""
    name = re.sub(r"[^A-Z0-9_]", "_", key.upper()).lstrip("_0123456789") or "FIELD"
    return ("SAIGEEDGE_" + name)[:64]


def _text(value: object) -> str:
    """str(value) that journald takes: a file name that is not UTF-8 (lone surrogates) shows its bytes escaped."""
    return str(value).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def journal_fields(event_dict: MutableMapping[str, Any]) -> dict[str, str]:
    """SAIGEEDGE_EVENT plus one SAIGEEDGE_<KEY> per key, and a human MESSAGE."""
    event = str(event_dict.pop("event", ""))
    event_dict.pop("timestamp", None)
    level = str(event_dict.pop("level", "info"))
    fields = {journal_field(k): _text(v) for k, v in event_dict.items() if v is not None}
    details = " ".join(f"{k}={v}" for k, v in event_dict.items() if v is not None and k not in ("job_id",))
    job = f" {event_dict['job_id']}" if event_dict.get("job_id") else ""
    fields.update(MESSAGE=_text(f"{event}{job} {details}".strip()), PRIORITY=str(PRIORITY.get(level, 6)),
                  SYSLOG_IDENTIFIER=IDENTIFIER, SAIGEEDGE_EVENT=event)
    return fields


class JournalSink:
    """The last processor: one journal entry per event, then the event is dropped.

    When journald cannot be reached (not running, restarting, a stale socket), the event is printed to
    stderr as a JSON line instead, with `journal_error` set: losing an event, or the daemon, over a log
    sink would be worse than a line in the wrong place.
    """

    def __init__(self) -> None:
        from systemd import journal

        self._send = journal.send
        self._stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
        self._render = structlog.processors.JSONRenderer()

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> Any:
        fields = journal_fields(dict(event_dict))
        message = fields.pop("MESSAGE")
        try:
            if not os.path.exists(JOURNAL_SOCKET):  # libsystemd drops events silently in this one case
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), JOURNAL_SOCKET)
            self._send(message, **fields)
        except OSError as exc:
            event_dict["journal_error"] = str(exc)
            return self._render(logger, method, self._stamp(logger, method, event_dict))
        raise structlog.DropEvent


def journal_unreachable() -> str | None:
    """Why journald cannot take events right now (a connect probe: the socket file can outlive journald)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(JOURNAL_SOCKET)
    except OSError as exc:
        return f"{JOURNAL_SOCKET}: {exc.strerror or exc}"
    finally:
        probe.close()
    return None


def journal_connected() -> bool:
    """stderr is a journal stream (JOURNAL_STREAM names its dev:ino), as under systemd."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def choose_format(setting: str) -> str:
    if setting != "auto":
        return setting
    if journal_connected():
        return "journal"
    return "console" if sys.stderr.isatty() else "json"


def configure(setting: str = "auto", level: str = "info") -> str:
    """Configure structlog once, for the whole process; returns the format chosen."""
    fmt = choose_format(setting)
    processors: list[Any] = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level]
    if fmt == "journal":
        processors.append(JournalSink())  # nothing is printed: printing to a journal stream would log twice
    else:
        processors += [structlog.processors.TimeStamper(fmt="iso", utc=True),
                       structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()]
    structlog.configure(processors=processors, wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr), cache_logger_on_first_use=False)
    return fmt

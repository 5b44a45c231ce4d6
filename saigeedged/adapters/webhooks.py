"""Completion notifications (SPEC §13): the config's channels, one bounded background sender per channel.

A POST is retried with backoff for a bounded time; whatever happens it is a `notify.sent` or `notify.failed`
journal event, never a job failure, and nothing here ever waits on the worker's or the claim's thread.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

import requests
import structlog

from saigeedged import __version__
from saigeedged.adapters.outbox import status_doc
from saigeedged.config import _merge
from saigeedged.errors import SaigeError
from saigeedged.guards import headline
from saigeedged.jobs import TERMINAL, Job

log = structlog.get_logger()
EVENTS = ("succeeded", "failed", "cancelled")
FORMATS = ("json", "slack")
CHANNEL_DEFAULTS: dict[str, Any] = {"url": "", "events": list(EVENTS), "format": "json", "timeout_s": 10.0,
                                    "retry_for_s": 600.0}
QUEUE_MAX = 1000  # per channel: beyond this a dead endpoint costs a `notify.failed` each, not memory
BACKOFF_FIRST_S, BACKOFF_MAX_S = 1.0, 60.0
ICONS = {"succeeded": ":white_check_mark:", "failed": ":x:", "cancelled": ":heavy_minus_sign:"}


@dataclass(frozen=True)
class Channel:
    """One configured endpoint."""

    url: str
    events: frozenset[str]
    format: str
    timeout_s: float
    retry_for_s: float

    @property
    def shown(self) -> str:
        return shown(self.url)


def _parts(url: str) -> SplitResult | None:
    """The URL's parts, or None when it cannot be parsed (an unclosed `[`, a port out of range)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parsed on access: raises for a bad port)
    except ValueError:
        return None
    return parts


def shown(url: str) -> str:
    """A URL as logged: scheme, host and port only (a webhook's path, query or user:token@ is often its secret)."""
    parts = _parts(url)
    if parts is None:
        return "(a URL that cannot be parsed)"
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")


def _invalid(where: str, message: str) -> SaigeError:
    return SaigeError("MANIFEST_INVALID", f"config: `{where}` {message}",
                      hint="notify: [{url: https://..., events: [succeeded, failed, cancelled], format: json}]")


def channels(entries: list[Any]) -> list[Channel]:
    """The config's `notify:` list, checked: unknown keys, an URL that is not http(s), unknown events or formats."""
    found = []
    for i, entry in enumerate(entries):
        where = f"notify[{i}]"
        raw = _merge(entry, CHANNEL_DEFAULTS, f"{where}.")
        parts = _parts(raw["url"])
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise _invalid(f"{where}.url", f"must be an http:// or https:// URL, got {shown(raw['url'])!r}")
        unknown = [e for e in raw["events"] if e not in EVENTS]
        if unknown or not raw["events"]:
            raise _invalid(f"{where}.events", f"must list some of {', '.join(EVENTS)}, got {raw['events']!r}")
        if raw["format"] not in FORMATS:
            raise _invalid(f"{where}.format", f"must be one of {', '.join(FORMATS)}, got {raw['format']!r}")
        if raw["timeout_s"] <= 0 or raw["retry_for_s"] < 0:
            raise _invalid(where, "timeout_s must be > 0 and retry_for_s >= 0")
        found.append(Channel(raw["url"], frozenset(raw["events"]), raw["format"], float(raw["timeout_s"]),
                             float(raw["retry_for_s"])))
    return found


def _plain(value: Any) -> str:
    """Text Slack shows as written: `<!channel>`, `<@U1>` or `<https://x|y>` in a dropper's value stay inert."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(doc: dict[str, Any]) -> str:
    """One Slack message: job, state, target; the bundle path, or the error code, message and hint."""
    lines = [f"{ICONS.get(doc['state'], '')} saigeedged: *{_plain(doc['name'])}* {doc['state']} "
             f"({doc['target']}, job `{_plain(doc['job_id'])}`)"]
    if doc.get("bundle"):
        lines.append(f"bundle: {_plain(doc['bundle']['path'])}")
    if doc.get("error"):
        error = doc["error"]
        message = headline(str(error['message'])) if error['message'] else ''
        lines.append(f"{error['code']}: {_plain(message)}")
        lines.append(f"hint: {_plain(error['hint'])}")
    return "\n".join(lines)


def body(channel: Channel, doc: dict[str, Any]) -> bytes:
    """What is POSTed: the final status document itself, or a Slack-compatible `{"text": ...}`."""
    payload = {"text": slack_text(doc)} if channel.format == "slack" else doc
    return json.dumps(payload).encode()


def post(channel: Channel, data: bytes) -> tuple[bool, str]:
    """One POST → (done, why not). Done means delivered, or refused in a way a retry cannot change (a 4xx)."""
    try:
        reply = requests.post(channel.url, data=data, timeout=channel.timeout_s, allow_redirects=False,
                              headers={"Content-Type": "application/json", "User-Agent": f"saigeedged/{__version__}"})
    except requests.RequestException as exc:
        return False, type(exc).__name__
    if 200 <= reply.status_code < 300:
        return True, ""
    final = 300 <= reply.status_code < 500 and reply.status_code not in (408, 429)  # redirects are not followed
    return final, f"HTTP {reply.status_code}"


class Sender:
    """Takes final jobs from any thread without waiting; one daemon thread per channel POSTs them in order."""

    def __init__(self, chans: list[Channel], stop: threading.Event | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stop_event = stop or threading.Event()
        self.clock = clock
        self._lanes = [(c, queue.Queue[dict[str, Any]](QUEUE_MAX)) for c in chans]
        self._seen: deque[tuple[str, str]] = deque(maxlen=4 * QUEUE_MAX)  # ends already queued: one POST per end
        self._seen_lock = threading.Lock()  # the worker's observer and the ops thread's look at the queue may race
        self._threads = [threading.Thread(target=self._run, args=lane, name=f"saigeedged-notify-{i}", daemon=True)
                         for i, lane in enumerate(self._lanes)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """No new POST starts; what waits in the queues is logged `notify.failed` now, from the stopping thread (a
        lane may sit in a slow POST until the process is gone)."""
        self.stop_event.set()
        for channel, lane in self._lanes:
            self._drain(channel, lane)

    def _drain(self, channel: Channel, lane: queue.Queue[dict[str, Any]]) -> None:
        while True:
            try:
                doc = lane.get_nowait()
            except queue.Empty:
                return
            self._failed(channel, doc, "the daemon stopped before it was sent", 0)

    def job_ended(self, job: Job) -> None:
        """Queue a final job's notification for every channel that wants its state; never blocks."""
        key = (job.job_id, job.finished_at or "")
        with self._seen_lock:
            if job.state not in TERMINAL or key in self._seen:
                return
            self._seen.append(key)
        doc = status_doc(job)
        for channel, lane in self._lanes:
            if job.state not in channel.events:
                continue
            try:
                lane.put_nowait(doc)
            except queue.Full:
                self._failed(channel, doc, "the notification queue is full", 0)

    def _run(self, channel: Channel, lane: queue.Queue[dict[str, Any]]) -> None:
        while not self.stop_event.is_set():
            try:
                doc = lane.get(timeout=0.5)
            except queue.Empty:
                continue
            self.deliver(channel, doc)
        self._drain(channel, lane)  # what is left at a stop is said, not lost silently

    def deliver(self, channel: Channel, doc: dict[str, Any]) -> None:
        """POST until delivered or `retry_for_s` has passed, waiting 1 s, 2 s, 4 s ... (at most 60 s) between tries."""
        data, deadline, delay, attempt = body(channel, doc), self.clock() + channel.retry_for_s, BACKOFF_FIRST_S, 0
        while True:
            attempt += 1
            done, why = post(channel, data)
            if done and not why:
                log.info("notify.sent", job_id=doc["job_id"], job_name=doc["name"], state=doc["state"],
                         channel=channel.shown, attempts=attempt)
                return
            if done or self.clock() + delay > deadline:
                self._failed(channel, doc, why, attempt)
                return
            log.info("notify.retrying", job_id=doc["job_id"], job_name=doc["name"], channel=channel.shown,
                     attempts=attempt, message=why, retry_in_s=delay)
            if self.stop_event.wait(delay):
                self._failed(channel, doc, f"{why}; the daemon stopped", attempt)
                return
            delay = min(delay * 2, BACKOFF_MAX_S)

    @staticmethod
    def _failed(channel: Channel, doc: dict[str, Any], why: str, attempts: int) -> None:
        log.warning("notify.failed", job_id=doc["job_id"], job_name=doc["name"], state=doc["state"],
                    channel=channel.shown, attempts=attempts, message=why)

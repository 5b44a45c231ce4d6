"""A full state_dir is waited out, never fatal (issue 26): the daemon starts degraded (READY=1, STATUS= says why, the
watchdog pinged) until its database opens and recovery is written; a worker's write waits for space instead of failing
its job; the main loop never waits (its rounds try again), so the watchdog pings go on."""

from __future__ import annotations

import errno
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import structlog

from saigeedged.adapters.notify import Notifier
from saigeedged.adapters.store import StoreFull

log = structlog.get_logger()
T = TypeVar("T")
PROBE_BYTES = 1 << 20  # a write this large must fit before a job that found state_dir full goes on
ROOM_POLL_S = 5.0  # how often a write or the start-up is tried again while state_dir is full
STATUS = "state_dir full: waiting for space"
HINT = "free space in state_dir (`df` on it; old work dirs and logs are safe to remove once their jobs ended)"


def full(exc: BaseException) -> bool:
    """Does `exc` say state_dir is full (or failing)? A database write, or a file of ours there (ENOSPC, EDQUOT)."""
    return isinstance(exc, StoreFull) or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT))


def start_degraded(attempt: Callable[[], T], stop: threading.Event, notifier: Notifier,
                   clock: Callable[[], float] = time.monotonic) -> T | None:
    """`attempt()` until state_dir has room for it: meanwhile READY=1 (once) with STATUS= saying why, watchdog pings,
    one journal line. None when stopped first; any other error is raised."""
    said = False
    while True:
        try:
            return attempt()
        except (StoreFull, OSError) as exc:
            if not full(exc):
                raise
            if not said:
                log.error("state.full", error_code="INTERNAL", hint=HINT,
                          message=f"{exc}: starting degraded, tried again every {ROOM_POLL_S:.0f}s")
                notifier.ready(STATUS)
                said = True
        deadline = clock() + ROOM_POLL_S
        while clock() < deadline:
            notifier.watchdog(clock())
            if stop.wait(min(notifier.interval or ROOM_POLL_S, max(0.0, deadline - clock()))):
                return None


def wait_for_disk(folder: Path, wait: Callable[[StoreFull], bool] | None, why: str) -> None:
    """Return once `folder` takes a file again (a worker's host steps, its job log), waiting with `wait` (the daemon's
    Waiting: said once, STATUS=) between tries; at once when there is no `wait` or it says stop."""
    while True:
        try:
            with tempfile.TemporaryFile(dir=folder) as probe:
                probe.write(b"\0" * PROBE_BYTES)
                probe.flush()
                os.fsync(probe.fileno())
            return
        except OSError as exc:
            if not full(exc):
                return  # not a full disk: not for this wait (the next write says what it is)
        if wait is None or not wait(StoreFull(f"{why} ({folder})")):
            return


class Waiting:
    """The wait of writes off the main loop for room in state_dir (Store.wait_for_room), and what STATUS= says."""

    def __init__(self, stop: threading.Event, clock: Callable[[], float] = time.monotonic) -> None:
        self.stop, self.clock = stop, clock
        self.since: float | None = None  # when a write first found state_dir full in this episode
        self.last = 0.0  # when one last did

    def __call__(self, exc: StoreFull) -> bool:
        """Wait ROOM_POLL_S and say True (try again), unless on the main loop (its next round tries again) or
        stopping: then False, and the write raises StoreFull."""
        if self.since is None:
            self.since = self.clock()
            log.error("state.full", error_code="INTERNAL", hint=HINT,
                      message=f"{exc}: the running job waits for space (it is not failed for it)")
        self.last = self.clock()
        if threading.current_thread() is threading.main_thread() or self.stop.is_set():
            return False
        return not self.stop.wait(ROOM_POLL_S)

    def status(self) -> str:
        """", or what STATUS= adds while writes wait; the episode ends once none has waited for two rounds."""
        if self.since is not None and self.clock() - self.last > 2 * ROOM_POLL_S:
            log.info("state.room", message="state_dir has room again", waited_s=round(self.clock() - self.since))
            self.since = None
        return "" if self.since is None else f", {STATUS}"

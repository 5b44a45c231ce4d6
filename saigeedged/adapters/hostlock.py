"""One job at a time in each of the local engine's containers, across processes: an flock per container under
state_dir (the cubie and the mobilint container each run their own job)."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable
from pathlib import Path

from saigeedged.errors import SaigeError


class HostLock:
    """One job at a time in a container, across processes: an flock under state_dir."""

    POLL_S = 0.2  # flock has no timeout: a waiter polls so that a stop or cancel can end the wait

    def __init__(self, state_dir: Path, container: str) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self._fh = (state_dir / f"container-{container}.lock").open("a")
        self.held = False

    def acquire(self, on_wait: Callable[[], None] | None = None,
                interrupted: Callable[[], str | None] = lambda: None) -> None:
        """Take the lock; while another process holds it, call on_wait once and raise CANCELLED when interrupted."""
        waited = False
        while not self.held:
            try:
                fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
            except BlockingIOError:
                if not waited and on_wait:
                    on_wait()
                waited = True
                reason = interrupted()
                if reason is not None:
                    raise SaigeError("CANCELLED", f"stopped while waiting for the container lock ({reason})",
                                     reason=reason) from None
                time.sleep(self.POLL_S)

    def release(self) -> None:
        if self.held:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self.held = False

"""A Docker engine outage, as the worker sees it: since when, and when to ask the engine again.

While the engine is unreachable (dockerd stopped, restarting, the socket gone) jobs for the containers wait
in the queue without spending an attempt, host jobs go on, and the engine is pinged with a growing backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DOCKER_TARGETS = ("cubie", "mobilint")
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # between pings; the last one repeats


class Outage:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.since: float | None = None
        self.targets: set[str] = set()  # targets whose steps may have run on unseen: reaped when the engine is back
        self._pings = 0
        self._next = 0.0

    @property
    def active(self) -> bool:
        return self.since is not None

    def begin(self, target: str) -> bool:
        """A job found the engine unreachable; True when this starts a new outage."""
        self.targets.add(target)
        if self.since is not None:
            return False
        self.since, self._pings, self._next = self.clock(), 0, self.clock() + BACKOFF_S[0]
        return True

    def due(self) -> bool:
        return self.active and self.clock() >= self._next

    def still_down(self) -> None:
        self._pings += 1
        self._next = self.clock() + BACKOFF_S[min(self._pings, len(BACKOFF_S) - 1)]

    def wait_s(self, idle_s: float) -> float:
        """How long the idle worker may sleep: until the next ping at most."""
        return max(0.0, min(idle_s, self._next - self.clock())) if self.active else idle_s

    def end(self) -> float:
        """The engine answers again; returns how long it was away."""
        down = self.clock() - (self.since or self.clock())
        self.since = None
        self.targets.clear()
        return down

"""The finishing stage (issue 25): a container job's accuracy report, bundle and publication, made after its last
container step while its slot takes the next job; the container (SPEC §2's serial resource) never waits for the host.

One job at a time, in hand-over order: a report runs in the bounded child, and two at once would hold
limits.child_memory_bytes twice. A handed job stays `running` in the same attempt (the store's fence), so a cancel
reaches it here, and a stop records it detached (its attempt record) like a step that runs on: the next start
re-attaches it, which replays the ended container steps from their exit codes (or the cache) and makes the report
again, never the compile (SPEC §15).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from saigeedged.adapters.docker import Containers
from saigeedged.compile import pipeline
from saigeedged.config import Config
from saigeedged.jobs import Job
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.slot import Slot
from saigeedged.service.worker import Worker

STAGE = "report"  # the stage's slot: no engine has this name and it takes no target from the queue


class Finisher(Worker):
    """A worker whose jobs are handed over by the other workers (hand()), not taken from the queue."""

    def __init__(self, config: Config, jobs: Jobs, containers: Containers, places: Places,
                 on_change: Callable[[], None] = lambda: None) -> None:
        super().__init__(config, jobs, containers, places, on_change, Slot(STAGE, ()), threading.Event())
        self.handed: deque[tuple[Job, pipeline.Compiled]] = deque()
        self._queue = threading.Lock()

    def hand(self, job: Job, compiled: pipeline.Compiled) -> None:
        with self._queue:
            self.handed.append((job, compiled))
        self.wake.set()

    def _take(self) -> tuple[Job | None, bool, pipeline.Compiled | None]:
        with self._queue:
            if not self.handed:
                return None, False, None
            job, compiled = self.handed.popleft()
        return job, False, compiled

    def shown(self) -> Job | None:
        """The job STATUS= shows: the one whose report is being made, else the next handed one."""
        with self._queue:
            waiting = self.handed[0][0] if self.handed else None
        return self.current or waiting

    def owned(self) -> list[Job]:
        """The jobs of this stage: the one whose report is being made and those handed over and waiting; a stop
        records them all as detached (Worker.stop), like a step that runs on: the next start re-attaches them."""
        with self._queue:
            waiting = [job for job, _ in self.handed]
        return [*super().owned(), *waiting]

    def stop(self) -> None:
        super().stop()
        with self._queue:
            self.handed.clear()

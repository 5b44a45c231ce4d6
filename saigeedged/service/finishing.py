"""The finishing stage (issue 25): a container job's accuracy report, bundle and publication, made after its last
container step while its slot takes the next job; the container (SPEC §2's serial resource) never waits for the host.

REPORTS_AT_ONCE reports at a time, taken in hand-over order: on a small compile host the container's steps leave a
core idle while they wait (a stand-in compiler or a real one), and one report stage alone was the burst's bottleneck
(bench/burst.py: a 640 report is a second of CPU a job, the job beside it half a second). Each report runs in its
own bounded child, so two hold up to limits.child_memory_bytes each. A handed job stays `running` in the same attempt
(the store's fence), so a cancel reaches it here, and a stop records it detached (its attempt record) like a step
that runs on: the next start re-attaches it, which replays the ended container steps from their exit codes (or the
cache) and makes the report again, never the compile (SPEC §15).
"""

from __future__ import annotations

import os
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

STAGE = "report"  # the stage's slots: no engine has this name and they take no target from the queue
REPORTS_AT_ONCE = 2 if (os.cpu_count() or 1) > 1 else 1


class Handed:
    """The jobs handed to the finishing stage and not yet taken by one of its finishers (Finishing.hand)."""

    def __init__(self) -> None:
        self.jobs: deque[tuple[Job, pipeline.Compiled]] = deque()
        self.lock = threading.Lock()
        self.finishers: list[Finisher] = []

    def hand(self, job: Job, compiled: pipeline.Compiled) -> None:
        with self.lock:
            self.jobs.append((job, compiled))
        for finisher in self.finishers:
            finisher.wake.set()

    def pop(self) -> tuple[Job, pipeline.Compiled] | None:
        with self.lock:
            return self.jobs.popleft() if self.jobs else None

    def waiting(self) -> list[Job]:
        with self.lock:
            return [job for job, _ in self.jobs]


class Finisher(Worker):
    """A worker whose jobs are handed over by the other workers (Handed.hand), not taken from the queue. The first
    of the stage (`lead`) also answers for the jobs handed and not yet taken (STATUS=, a stop's detached records)."""

    def __init__(self, config: Config, jobs: Jobs, containers: Containers, places: Places, handed: Handed,
                 lead: bool, on_change: Callable[[], None] = lambda: None) -> None:
        super().__init__(config, jobs, containers, places, on_change, Slot(STAGE, ()), threading.Event())
        self.handed, self.lead = handed, lead
        handed.finishers.append(self)

    def _take(self) -> tuple[Job | None, bool, pipeline.Compiled | None]:
        taken = self.handed.pop()
        return (None, False, None) if taken is None else (taken[0], False, taken[1])

    def shown(self) -> Job | None:
        """The job STATUS= shows: the one whose report this finisher makes, else (the lead) the next handed one."""
        waiting = self.handed.waiting() if self.lead else []
        return self.current or (waiting[0] if waiting else None)

    def owned(self) -> list[Job]:
        """The jobs of this finisher: the one whose report it makes and (the lead) those handed over and waiting; a
        stop records them all as detached (Worker.stop), like a step that runs on: the next start re-attaches them."""
        return [*super().owned(), *(self.handed.waiting() if self.lead else [])]

    def stop(self) -> None:
        super().stop()  # the waiting jobs recorded detached first (owned), then forgotten: the next start has them
        if self.lead:
            with self.handed.lock:
                self.handed.jobs.clear()

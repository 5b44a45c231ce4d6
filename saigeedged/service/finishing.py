"""The finishing stage (issue 25): a job's accuracy report, bundle and publication, made after its last container
step (a host job: after its quantize and §6c report) while its slot takes the next job; the container (SPEC §2's serial
resource), or the host compile that is a host job's, never waits for a report.

REPORTS_AT_ONCE reports at a time, taken in hand-over order: on a small compile host the container's steps leave a
core idle while they wait (a stand-in compiler or a real one), and one report stage alone was the burst's bottleneck
(bench/burst.py: a 640 report is a second of CPU a job, the job beside it half a second). Each report runs in its
own bounded child, so two hold up to limits.child_memory_bytes each, at a lower CPU priority than the compiles
(report.REPORT_NICE). A handed job stays `running` in the same attempt (the store's fence), so a cancel reaches it
here, and a stop records a container job detached (its attempt record) like a step that runs on: the next start
re-attaches it, which replays the ended container steps from their exit codes (or the cache) and makes the report
again, never the compile (SPEC §15). A host job has nothing that runs on: a stop sends it back to the queue as a stop
in its worker does (its compile again, or the cache's).

A cubie job's simulator call (`pegasus inference` over the held-out images, SPEC §17) is made here too, in the
container the job was handed over with (Container.beside, adapters.docker.Beside): beside the next job's steps, as
compiles still run one at a time; with the real toolkit it is a start-up and a simulation of every image, which held
the container for the next compile. Not on a Slurm node: there it is made by the job's worker, whose cluster job holds
the node.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable

from saigeedged.adapters.docker import Beside, Container
from saigeedged.compile import pipeline
from saigeedged.config import Config
from saigeedged.engines import CONTAINER_TARGETS
from saigeedged.errors import SaigeError
from saigeedged.jobs import Job
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.slot import Slot
from saigeedged.service.worker import Worker

STAGE = "report"  # the stage's slots: no engine has this name and they take no target from the queue
REPORTS_AT_ONCE = 2 if (os.cpu_count() or 1) > 1 else 1


class Handed:
    """The jobs handed to the finishing stage and not yet taken by one of its finishers (Finishing.hand)."""

    def __init__(self) -> None:
        # each with the container its steps ran in, for a container call still to make (Container.beside), or None
        self.jobs: deque[tuple[Job, pipeline.Compiled, Container | None]] = deque()
        self.lock = threading.Lock()
        self.finishers: list[Finisher] = []

    def hand(self, job: Job, compiled: pipeline.Compiled, container: Container | None = None) -> None:
        with self.lock:
            self.jobs.append((job, compiled, container))
        for finisher in self.finishers:
            finisher.wake.set()

    def pop(self) -> tuple[Job, pipeline.Compiled, Container | None] | None:
        with self.lock:
            return self.jobs.popleft() if self.jobs else None

    def waiting(self) -> list[Job]:
        with self.lock:
            return [job for job, _, _ in self.jobs]


class Finisher(Worker):
    """A worker whose jobs are handed over by the other workers (Handed.hand), not taken from the queue. The first
    of the stage (`lead`) also answers for the jobs handed and not yet taken (STATUS=, a stop's detached records)."""

    def __init__(self, config: Config, jobs: Jobs, containers: Beside, places: Places, handed: Handed,
                 lead: bool, on_change: Callable[[], None] = lambda: None) -> None:
        super().__init__(config, jobs, containers, places, on_change, Slot(STAGE, ()), threading.Event())
        self.handed, self.lead, self.beside = handed, lead, containers
        self.rehome: Callable[[Job], None] = lambda job: None  # set by the pool: the job to a worker of its slot
        handed.finishers.append(self)

    def _take(self) -> tuple[Job | None, bool, pipeline.Compiled | None]:
        taken = self.handed.pop()
        if taken is None:
            return None, False, None
        job, compiled, container = taken
        self.beside.hold(container)  # let go by the job's end (Worker.execute: containers.release)
        return job, False, compiled

    def shown(self) -> Job | None:
        """The job STATUS= shows: the one whose report this finisher makes, else (the lead) the next handed one."""
        waiting = self.handed.waiting() if self.lead else []
        return self.current or (waiting[0] if waiting else None)

    def owned(self) -> list[Job]:
        """The jobs of this finisher: the one whose report it makes and (the lead) those handed over and waiting; a
        stop records them all as detached (Worker.stop), like a step that runs on: the next start re-attaches them."""
        return [*super().owned(), *(self.handed.waiting() if self.lead else [])]

    def _hold(self, job: Job) -> None:
        """A handed job held for its engine (its simulator call may run on) or for room in state_dir goes back to a
        worker of its slot, which re-attaches it when it can (replaying its steps) and hands it over again: a
        finisher takes no job but those handed to it."""
        self.rehome(job)

    def stop(self) -> None:
        if self.lead:  # host jobs still waiting go back to the queue as a stop, not left to count as a crash
            with self.handed.lock:
                hosts = [taken for taken in self.handed.jobs if taken[0].target not in CONTAINER_TARGETS]
                for taken in hosts:
                    self.handed.jobs.remove(taken)
            for job, _, _ in hosts:
                self._settle_now(job, SaigeError("CANCELLED", "the daemon stopped before its report was made",
                                                 reason="stop", step=job.step))
        super().stop()  # the waiting jobs recorded detached first (owned), then forgotten: the next start has them
        if self.lead:
            with self.handed.lock:
                self.handed.jobs.clear()

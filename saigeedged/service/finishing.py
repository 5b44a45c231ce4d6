"""The finishing stage (issue 25): a job's accuracy report (a variant sweep's: every variant's, then the one to
publish chosen), bundle and publication, made after its last container step (a host job: after its quantize and §6c
report) while its slot takes the next job; the container (SPEC §2's serial
resource), or the host compile that is a host job's, never waits for a report, nor for an outbox that refuses bundles
(a job without a report is handed over too: its publication may wait limits.publish_patience_s).

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

import structlog

from saigeedged.adapters.docker import Beside, Container
from saigeedged.compile import pipeline
from saigeedged.config import Config
from saigeedged.engines import CONTAINER_TARGETS
from saigeedged.errors import SaigeError
from saigeedged.jobs import CANCELLED, Attempt, Job, Superseded
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.slot import Slot, remove_work, work_dir
from saigeedged.service.worker import Worker

log = structlog.get_logger()
STAGE = "report"  # the stage's slots: no engine has this name and they take no target from the queue
REPORTS_AT_ONCE = 2 if len(os.sched_getaffinity(0)) > 1 else 1  # the cores this process may use (CPUAffinity=)
# handed jobs that may wait for a finisher: past it a worker makes its job's report itself. Reports at nice +10 beside
# a burst of compiles fall behind; unbounded, the jobs (their work dirs, `running` for ever longer) piled up here
WAITING_MAX = 4 * REPORTS_AT_ONCE


class Handed:
    """The jobs handed to the finishing stage and not yet taken by one of its finishers (Finishing.hand)."""

    def __init__(self) -> None:
        # each with the container its steps ran in, for a container call still to make (Container.beside), or None
        self.jobs: deque[tuple[Job, pipeline.Compiled, Container | None]] = deque()
        self.lock = threading.Lock()
        self.finishers: list[Finisher] = []

    def hand(self, job: Job, compiled: pipeline.Compiled, container: Container | None = None,
             taken: Callable[[], None] = lambda: None) -> bool:
        with self.lock:  # the check and the append at once: workers of several slots never pass the cap together
            if len(self.jobs) >= WAITING_MAX:
                return False
            taken()  # (before any finisher can take it: its `job.finishing` comes before the finisher's steps)
            self.jobs.append((job, compiled, container))
        for finisher in self.finishers:
            finisher.wake.set()
        return True

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

    def _own(self, job: Job) -> Job:
        """A handed job taken: cancelled while it waited (the main loop passed it to no worker), it ends so first."""
        owned = super()._own(job)
        if self.jobs.store.cancel_requested(job.job_id):
            self.interrupt("cancel")
        return owned

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
        try:
            if self.lead:
                self._requeue_hosts()
        finally:
            super().stop()  # the waiting jobs recorded detached first (owned), then forgotten: the next start has them
            if self.lead:
                with self.handed.lock:
                    self.handed.jobs.clear()

    def _unhand(self, which: Callable[[Job], bool]) -> list[tuple[Job, pipeline.Compiled, Container | None]]:
        """Take back the waiting jobs `which` picks (no finisher will make their reports)."""
        with self.handed.lock:
            taken = [t for t in self.handed.jobs if which(t[0])]
            for t in taken:
                self.handed.jobs.remove(t)
        return taken

    def _requeue_hosts(self) -> None:
        """Host jobs still waiting go back to the queue as a stop (their work dirs removed), not left running to count
        as a crash at the next start: nothing of theirs runs on. One the store does not take now (state_dir full) is
        left to the next start's recovery."""
        for job, _, _ in self._unhand(lambda job: job.target not in CONTAINER_TARGETS):
            try:
                self._settle_now(job, SaigeError("CANCELLED", "the daemon stopped before its report was made",
                                                 reason="stop", step=job.step))
            except Exception as exc:  # a stop goes on whatever one job's settlement meets
                log.warning("job.unsettled", job_id=job.job_id, job_name=job.name, message=str(exc))
                continue
            self._drop_work(job)

    def cancel(self, job_id: str) -> list[Attempt]:
        """`saigeedged cancel` of a job waiting for a finisher (the lead answers for those) ends it cancelled now:
        nothing of it runs (its container steps ended, its simulator call is not made). One whose end the store does
        not take now (state_dir full) waits on: the main loop asks again, a finisher that takes it ends it (_own)."""
        for taken in self._unhand(lambda job: job.job_id == job_id) if self.lead else []:
            job = taken[0]
            stored = self._stored_running(job)
            if stored is None:
                continue
            error = SaigeError("CANCELLED", "cancelled while it waited for its report", reason="cancel", step=job.step)
            try:
                self.jobs.end(stored, CANCELLED, error, fence=Attempt.of(job))
            except Superseded:
                continue
            except Exception as exc:
                log.warning("job.unsettled", job_id=job_id, job_name=job.name, message=str(exc))
                with self.handed.lock:
                    self.handed.jobs.appendleft(taken)
                continue
            self._drop_work(job)
        return super().cancel(job_id)

    def _drop_work(self, job: Job) -> None:
        if not self.config.keep_work:
            remove_work(work_dir(self.config.work_root, job))

"""A worker: runs the queued jobs of its slot one at a time and settles each one (publish, requeue or fail)."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from saigeedged import jobid
from saigeedged.adapters.docker import Container, Containers
from saigeedged.adapters.events import event
from saigeedged.adapters.joblog import JobLog
from saigeedged.compile import ahead, pipeline, resume
from saigeedged.compile.inputs import PathPolicy
from saigeedged.config import Config
from saigeedged.engines import CONTAINER_TARGETS
from saigeedged.errors import SaigeError
from saigeedged.jobs import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    Attempt,
    Job,
    Superseded,
    end_attempt,
    entry_from_doc,
)
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.publishing import publish_patiently
from saigeedged.service.slot import Slot, fresh_work_dir, remove_work, work_dir

log = structlog.get_logger()
IDLE_S = 1.0  # an idle worker looks at the queue this often when nothing wakes it


class Ahead(Protocol):
    """What a worker asks of the preparer (service/ahead.py, which knows the workers: so not imported here)."""

    def take(self, job: Job, interrupted: Callable[[], str | None]) -> ahead.Prep | None:
        """The prep made for this attempt of `job` (waited for if in progress), or None: run the host steps now."""


class Finishing(Protocol):
    """What a worker asks of the finishing stage (service/finishing.py, a Worker itself: so not imported here)."""

    def hand(self, job: Job, compiled: pipeline.Compiled) -> None:
        """Take `job` after its last container step: its report, bundle, publication and end are the stage's."""


class Worker(threading.Thread):
    """Takes the next queued job (priority, then FIFO) and runs it; one at a time."""

    def __init__(self, config: Config, jobs: Jobs, containers: Containers, places: Places,
                 on_change: Callable[[], None] = lambda: None, slot: Slot | None = None,
                 wake: threading.Event | None = None) -> None:
        self.slot = slot or Slot()
        super().__init__(name=f"saigeedged-worker-{self.slot.engine}-{'-'.join(self.slot.targets)}"
                         if self.slot.pooled else "saigeedged-worker", daemon=True)
        self.config, self.jobs, self.containers, self.places = config, jobs, containers, places
        self.on_change = on_change  # the daemon's STATUS= line follows the running job
        containers.interrupted = lambda: self._reason
        self.wake = wake or threading.Event()  # shared by the workers of a pool: a claim wakes them all
        self.stop_event = threading.Event()
        self.current: Job | None = None
        self.work: Path | None = None  # the current job's work dir
        # an attempt requeued under this worker by the engine watch (its engine stopped answering mid-call): `lease`
        # keeps that requeue out of a write under way, `abandoned` skips this worker's later writes at once; the store's
        # Attempt fence (`attempt`) is the arbiter either way (SPEC §15)
        self.lease = threading.Lock()
        self.abandoned = False
        self._reason: str | None = None
        self._lock = threading.Lock()
        self.ahead: Ahead | None = None  # set by the daemon: host steps of queued jobs done while one compiles
        # running jobs whose container step outlived the daemon before this one, or its engine's outage: re-attached
        # (the same attempt goes on) before this worker takes anything new
        self.resumable: list[Job] = []
        self.attempt: Attempt | None = None  # the current job's attempt: the store must still name it to write
        self.detached = False  # the current job's attempt goes on without this run: a stop or its engine's outage
        # the finishing stage (service/finishing.py): takes a container job after its last container step, so this
        # slot takes the next job while the report is made; None: this worker finishes its jobs itself
        self.finisher: Finishing | None = None
        self.handed_off = False  # the current job went to the finishing stage: its work dir and its end are its

    def run(self) -> None:
        while not self.stop_event.is_set():
            job, resumed, handed = self._take()
            if job is None:
                self.wake.wait(IDLE_S)
                self.wake.clear()
                continue
            try:
                self.execute(job, resumed=resumed, handed=handed)
            except Exception as exc:  # a guard: a bug settling one job must not stop the queue
                log.error("job.internal_error", job_id=job.job_id, job_name=job.name, error_code="INTERNAL",
                          message=f"{type(exc).__name__}: {exc}")
                self._abandon(job, exc)
                self.stop_event.wait(1.0)  # if the job could not be settled either, do not spin on it

    def _take(self) -> tuple[Job | None, bool, pipeline.Compiled | None]:
        """The next job: one to re-attach, else the first queued one of this slot's targets."""
        resumed = self._next_resumable()
        return resumed or self.jobs.store.next_queued(self.slot.skip()), resumed is not None, None

    def _next_resumable(self) -> Job | None:
        """A job to re-attach, once its engine answers; None when there is none (or it is not running any more)."""
        while True:
            with self._lock:  # the engine monitor moves held jobs elsewhere from its own thread
                held = next((j for j in self.resumable if self.slot.ready(j.target)), None)
                if held is None:
                    return None
                self.resumable.remove(held)
            job = self.jobs.store.get(held.job_id)
            if job is not None and job.state == RUNNING:
                return job

    def shown(self) -> Job | None:
        """The job STATUS= shows in this slot: the running one, else one whose step runs on while it waits for its
        engine (a compile under way, not an idle slot)."""
        with self._lock:
            return self.current or (self.resumable[0] if self.resumable else None)

    def interrupt(self, reason: str) -> None:
        """Stop the running job: a cancel kills its step in the container; a stop leaves it running there (SPEC §15:
        the step belongs to its attempt, the next daemon re-attaches); in-process steps stop at the next step.

        The kill is a Docker call that a hung engine may not answer for engine_timeout_s: it runs in a thread of
        its own so that the main loop (and its watchdog pings) never waits on it.
        """
        with self._lock:
            if self._reason == reason:
                return  # already asked (the main loop sees a cancel request until the job ends)
            job, self._reason = self.current, reason
        container, work = self.containers.active, self.work
        if reason != "stop" and job is not None and container is not None and work is not None:
            threading.Thread(target=container.interrupt, args=(work, reason),
                             name="saigeedged-interrupt", daemon=True).start()

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()
        self.interrupt("stop")
        with self._lock:  # held jobs (their engine does not answer) are left on purpose too: not a daemon dying
            held = list(self.resumable)
        for job in held:
            with contextlib.suppress(OSError):
                resume.detach(work_dir(self.config.work_root, job))

    def _start(self, job: Job) -> Job | None:
        """Take `job` if it is still queued and not cancelled: one conditional write (Store.take), so of the workers
        that saw it only one runs it; the job as taken (its attempt opened), else None."""
        before = job.attempts[-1]["engine"] if job.attempts else None
        taken = self.jobs.take(job.job_id, self.slot.engine_of(job.target))
        if taken is None:
            return None  # cancelled by `saigeedged cancel` meanwhile, or taken by another slot
        self._own(taken)
        event("job.started", taken, attempt=taken.attempt, engine=taken.engine)
        after = taken.attempts[-1]["engine"]
        if before is not None and before != after:
            event("job.moved", taken, "warning", from_engine=before, to_engine=after)
        self.on_change()
        return taken

    def _own(self, job: Job) -> None:
        """`job` is this worker's now; its attempt is the fence of every write it makes (SPEC §15)."""
        with self._lock:
            # a stop asked for just before the job was taken is not erased: the job stops before its first step
            self.current, self._reason = job, "stop" if self.stop_event.is_set() else None
            self.abandoned, self.detached, self.attempt = False, False, Attempt.of(job)
            self.handed_off = False

    def execute(self, queued: Job, resumed: bool = False, handed: pipeline.Compiled | None = None) -> None:
        job = self._reattach(queued) if resumed else self._take_over(queued) if handed else self._start(queued)
        if job is None:
            return
        fresh = not resumed and handed is None
        prepared = self.ahead.take(job, lambda: self._reason) if self.ahead and fresh else None  # made in `work`
        work = fresh_work_dir(self.config.work_root, job) if prepared is None and fresh else \
            work_dir(self.config.work_root, job)
        self.work = work
        joblog = JobLog(self.places.local_log(job.job_id))
        if handed is None:
            joblog.line(f"### {job.job_id} attempt {job.attempt} on {job.engine or 'saigeedged'}"
                        + (f", re-attached in step {job.step}" if resumed else ""))
        host = ahead.Ready(prepared, joblog) if prepared else resume.replay(work, joblog) if resumed else None
        try:
            try:
                self._run(job, work, joblog, host, handed)
                joblog.close()
                if not self.handed_off:
                    self._fenced(lambda: self._succeed(job))
            except SaigeError as exc:
                joblog.line(f"### {exc.code}: {exc.message}")
                joblog.close()
                self._fenced(functools.partial(self._settle, job, exc), quiet=True)
        except Superseded as exc:  # the store names another attempt now (moved, cancelled): this one writes nothing
            log.info("job.superseded", job_id=job.job_id, job_name=job.name, message=str(exc))
            self.abandoned = True
        finally:
            self.containers.release(None if self.detached or self.abandoned else work)
            with self._lock:
                self.current, self.work = None, None
            self.on_change()
            if not self.config.keep_work and not self.abandoned and not self.detached and not self.handed_off:
                remove_work(work)  # kept: a step that runs on (re-attached), one to reap, or the finishing stage's

    def _take_over(self, job: Job) -> Job:
        """Go on with a job another worker handed over after its last container step (the same attempt)."""
        self._own(job)
        self.on_change()
        return job

    def _reattach(self, job: Job) -> Job:
        """Go on with a running job's attempt: its step outlived the last daemon or an outage of its engine."""
        self._own(job)
        job.error = None  # the outage it waited through, if any, is over
        event("job.reattached", job, attempt=job.attempt, engine=job.engine)
        self.on_change()
        return job

    def _fenced(self, write: Callable[[], None], quiet: bool = False) -> None:
        """Write the job's row, status file or bundle unless its attempt was requeued under this worker (the engine
        stopped answering mid-call): that attempt's results are never published nor recorded."""
        with self.lease:
            if not self.abandoned:
                write()
                return
        if not quiet:
            raise SaigeError("ENGINE_LOST", "this attempt was requeued when its engine stopped answering", superseded=True)

    def _succeed(self, job: Job) -> None:
        fence = Attempt.of(job)
        end_attempt(job, jobid.iso(jobid.utc_now()), None)
        self.jobs.end(job, SUCCEEDED, fence=fence)

    def _run(self, job: Job, work: Path, joblog: JobLog, host: ahead.Replay | None = None,
             handed: pipeline.Compiled | None = None) -> None:
        entry = entry_from_doc(job.entry)
        rel = Path(job.subdir) / entry.output_name
        policy = PathPolicy((Path(job.claim_dir), self.places.inbox, *self.config.allowed_roots))

        def on_step(name: str, index: int, count: int) -> None:
            job.step, job.step_index, job.step_count = name, index, count  # progress names its own step
            self._fenced(lambda: self.jobs.save(job, fence=self.attempt))
            event("job.step", job, index=index, count=count)
            self.on_change()

        def on_inputs(facts: dict[str, Any]) -> None:
            job.onnx_sha256 = facts.get("onnx_sha256", job.onnx_sha256)
            job.calib_samples = facts.get("calib_samples", job.calib_samples)
            job.cache = facts.get("cache", job.cache)
            job.accuracy = facts.get("accuracy", job.accuracy)

        def on_progress(progress: dict[str, Any]) -> None:
            job.progress = progress
            self._fenced(lambda: self.jobs.save(job, fence=self.attempt))

        def refused(exc: SaigeError, wait_s: float) -> None:
            event("publish.retrying", job, "warning", error_code=exc.code, message=exc.message, retry_in_s=wait_s)

        limits = self.config.limits

        attempt = self.attempt
        assert attempt is not None

        def publish(bundle: Path) -> None:
            def place() -> None:
                with self.jobs.holding(attempt):  # no requeue or move of the job can land while it is published
                    job.bundle = publish_patiently(lambda: self.jobs.outbox.publish_bundle(bundle, rel, job.job_id),
                                                   limits.publish_patience_s, lambda: self._reason, refused)
            self._fenced(place)

        run = pipeline.Job(job.job_id, entry, work, joblog, self.config, policy, on_step, on_progress, on_inputs,
                           container=self.containers.get, deadline=time.monotonic() + limits.job_timeout_s,
                           interrupted=lambda: self._reason, host=host,
                           current=lambda: not self.abandoned and self.jobs.still_current(attempt))
        if handed is not None:
            result: pipeline.Result | None = pipeline.finish(run, handed, publish, job.created_at)
        else:
            result = pipeline.run(run, publish, job.created_at, lambda compiled: self._hand_off(job, compiled))
        if result is None:
            return  # the finishing stage's now
        job.onnx_sha256, job.calib_samples, job.report = result.onnx_sha256, result.calib_samples, result.report
        if result.report and result.report.get("flagged"):
            event("job.quantization_flagged", job, "warning", outputs=",".join(result.report["flagged"]))

    def _hand_off(self, job: Job, compiled: pipeline.Compiled) -> bool:
        """Give a container job whose report is still to make to the finishing stage (True), so this slot is free."""
        if self.finisher is None or compiled.planned is None or job.target not in CONTAINER_TARGETS:
            return False
        finisher = self.finisher
        event("job.finishing", job)
        self._fenced(lambda: finisher.hand(job, compiled))  # not an attempt requeued under this worker meanwhile
        self.handed_off = True
        return True

    def _settle(self, job: Job, exc: SaigeError) -> None:
        """Requeue an interrupted or retryable job, else end it failed or cancelled; every write is fenced by the
        job's attempt (Superseded when the store names another one)."""
        max_attempts, fence = self.config.limits.max_attempts, Attempt.of(job)
        if exc.code == "CANCELLED" and exc.fields.get("reason") == "stop" and \
                resume.started(work_dir(self.config.work_root, job)):
            self._detach(job)  # its container step runs on: the row stays running, the next daemon re-attaches
            return
        if exc.code == "DOCKER_UNAVAILABLE":
            self._hold(job, exc, fence)
            return
        end_attempt(job, jobid.iso(jobid.utc_now()), exc.code)
        if exc.code == "CANCELLED" and exc.fields.get("reason") == "stop":  # the operator's, not the job's fault:
            self.jobs.requeue(job, "stop", spend_attempt=job.attempt < max_attempts, fence=fence)  # not past max
        elif exc.code == "CANCELLED":
            self.jobs.end(job, CANCELLED, exc, fence=fence)
        elif exc.retryable and job.attempt < max_attempts and not exc.fields.get("exhausted"):
            if exc.code == "CONTAINER_LOST":
                self._recreate(job)
            self.jobs.requeue(job, exc.code.lower(), exc, fence=fence)
        else:
            self.jobs.end(job, FAILED, exc, fence=fence)

    def lose(self, reason: str, elsewhere: Callable[[str], bool]) -> list[tuple[str, Path]]:
        """The engine is down: the jobs of this worker that wait on it and whose target another ready engine serves
        (`elsewhere`) are requeued (ENGINE_LOST) now, from the watching thread, and whatever those attempts do later
        is fenced off. Returns their work dirs (their steps are killed when the engine answers again)."""
        lost = []
        with self._lock:
            moved = [j for j in self.resumable if elsewhere(j.target)]  # waiting to re-attach: moved instead
            self.resumable = [j for j in self.resumable if j not in moved]
        for held in moved:
            lost.append((held.target, work_dir(self.config.work_root, held)))  # before the requeue moves its attempt on
            with contextlib.suppress(Superseded):  # cancelled or retried meanwhile: nothing of it to move
                self._settle(held, SaigeError("ENGINE_LOST", f"engine {held.engine} stopped answering: {reason}",
                                              step=held.step))
        if not self.lease.acquire(blocking=False):
            return lost  # writing its row or publishing: not waiting on the engine
        try:
            job, active, work = self.current, self.containers.active, self.work
            if job is None or self.abandoned or active is None or not active.calls or not elsewhere(job.target):
                return lost
            self.abandoned = True
            with contextlib.suppress(Superseded):
                self._settle(job, SaigeError("ENGINE_LOST", f"engine {job.engine} stopped answering: {reason}",
                                             step=job.step))
            return [*lost, *([(job.target, work)] if work is not None else [])]
        finally:
            self.lease.release()

    def _detach(self, job: Job) -> None:
        """A stop leaves the job's container step running: its work dir says the daemon left it on purpose."""
        self.detached = True
        resume.detach(work_dir(self.config.work_root, job))
        event("job.detached", job, attempt=job.attempt)

    def _hold(self, job: Job, exc: SaigeError, fence: Attempt) -> None:
        """The engine is unreachable: not the job's fault, so it waits with its attempt unspent. A step already
        started in the container may run on: the job stays running, its attempt open, and re-attaches once the engine
        answers; a job without one goes back to the queue (any slot may take it). The engine monitor decides whether
        it moves to another engine (SPEC §15)."""
        self.slot.on_lost(exc.message)
        self.detached = True  # its work dir stays: whatever may still run there is the monitor's to reap
        if resume.started(work_dir(self.config.work_root, job)):
            self._keep_running(job, exc)
            return
        end_attempt(job, jobid.iso(jobid.utc_now()), exc.code)
        self.jobs.requeue(job, "docker_unavailable", exc, spend_attempt=False, fence=fence)

    def _keep_running(self, job: Job, exc: SaigeError) -> None:
        """The job's step may run on while its engine does not answer: it stays running (the reason in its status
        file, no attempt spent) and re-attaches once the engine answers."""
        job.error = exc.as_dict(job.step)
        self.jobs.save(job, fence=Attempt.of(job))
        event("job.waiting", job, "warning", error_code=exc.code, message=exc.message, engine=job.engine)
        with self._lock:
            self.resumable.append(job)

    def _abandon(self, job: Job, exc: Exception) -> None:
        """Mark a job that hit a bug failed (INTERNAL) so the queue moves on; never raises."""
        try:
            current = self.jobs.store.get(job.job_id)
            if current is not None and current.state in (QUEUED, RUNNING):
                if current.state == QUEUED:
                    current.state = RUNNING
                    self.jobs.store.save(current)
                self.jobs.end(current, FAILED, SaigeError("INTERNAL", f"{type(exc).__name__}: {exc}"))
        except Exception as again:  # the store or the outbox itself is broken: leave the row for the next start
            log.error("job.internal_error", job_id=job.job_id, message=f"cannot settle: {again}")

    def _recreate(self, job: Job) -> None:
        container: Container = self.containers.container(job.target)
        container.recreate()

"""Prep-ahead (SPEC §11): while container slots compile, the host steps of the next queued jobs run in a bounded
child, so that a freed slot starts its first container step at once.

A prepared job is still `queued`: nothing about it is written (row, status file, journal at info is `job.prepared`
only). Its prep is used only by the attempt it was made for and only while its inputs are unchanged; anything else
(a failed prep, a cancel, a job pushed out of the window, a stop) throws the prep and its work folder away, and the
job runs its host steps itself, with their own errors. Nothing of it survives a restart (the worker starts afresh).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from saigeedged import jobid
from saigeedged.adapters.events import event
from saigeedged.adapters.store import Store
from saigeedged.compile import ahead, child
from saigeedged.compile.ahead import Prep
from saigeedged.compile.inputs import PathPolicy
from saigeedged.config import Config
from saigeedged.engines import CONTAINER_TARGETS
from saigeedged.jobs import HOST_ENGINE, QUEUED, RUNNING, Job, entry_from_doc
from saigeedged.service.slot import fresh_work_dir, remove_work, work_dir

if TYPE_CHECKING:
    from saigeedged.service.pool import Pool

log = structlog.get_logger()
IDLE_S = 1.0  # a look at the queue this often when nothing wakes the preparer
TAKE_POLL_S = 0.2  # a worker waiting for a prep in progress wakes this often (the preparer also notifies it)
CHILD_STEPS = ("validate", "surgery", "calibration")  # a job's own steps in a bounded child (host jobs: all but two)
YIELD = "yield"


def compiling(job: Job | None) -> bool:
    """Is this running job past its host steps, in a container (the time prep-ahead fills) or finishing?"""
    return job is not None and job.target in CONTAINER_TARGETS and job.step not in (None, *CHILD_STEPS)


def hosting(job: Job | None) -> bool:
    """Does this running job run its own work in a bounded child now (a prep for another job then yields to it,
    so that one child at a time holds limits.child_memory_bytes)?"""
    return job is not None and job.step is not None and not compiling(job) and job.step not in ("bundle", "publish")


def attach(config: Config, store: Store, pool: Pool) -> Preparer | None:
    """The preparer of a pool's workers, each given it (None when limits.prepare_ahead is off): it prepares while
    any container slot compiles, yields while any worker runs its own host steps, and keeps one prep per slot."""
    if not config.limits.prepare_ahead:
        return None
    workers = pool.workers

    def busy() -> tuple[int, str]:
        jobs = [job for job in (w.current for w in workers) if job is not None and compiling(job)]
        return len(jobs), jobs[0].job_id if jobs else ""

    slots = [w for w in workers if w.slot.engine != HOST_ENGINE and w.slot.targets]  # not the finishing stage
    preparer = Preparer(config, store, config.inbox, busy, lambda: any(hosting(w.current) for w in workers),
                        len(slots))
    for worker in workers:
        worker.ahead = preparer
    return preparer


class Preparer(threading.Thread):
    """Prepares the first queued jobs, at most `busy()` at a time (busy container slots) and keeps the preps of the
    first `slots` queued jobs; the worker takes a job's prep with take()."""

    def __init__(self, config: Config, store: Store, inbox: Path, busy: Callable[[], tuple[int, str]],
                 contended: Callable[[], bool] = lambda: False, slots: int = 1) -> None:
        super().__init__(name="saigeedged-ahead", daemon=True)
        self.config, self.store, self.inbox, self.busy, self.slots = config, store, inbox, busy, slots
        self.contended = contended  # a worker runs its own host steps in a child: a prep not taken yields
        self.wake = threading.Event()
        self.stop_event = threading.Event()
        self._preps: dict[str, Prep] = {}
        self._cond = threading.Condition()

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                job = self._next()
                if job is not None:
                    self._prepare(job)
                    continue
            except Exception as exc:  # a guard: prep-ahead is an optimisation, a bug in it must not stop the queue
                log.error("ahead.failed", message=f"{type(exc).__name__}: {exc}")
            self.wake.wait(IDLE_S)
            self.wake.clear()
        self._discard_all("stop")

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    # -- choosing ------------------------------------------------------------------------------
    def _next(self) -> Job | None:
        """The first job of the window without a prep, when fewer preps than busy slots are there; stale preps go."""
        window = self.store.head(QUEUED, self.slots)
        ids = {j.job_id for j in window} | {j.job_id for j in self.store.in_state(RUNNING)}  # started: take() is next
        with self._cond:
            stale = [p for p in self._preps.values() if p.job_id not in ids and not p.running]
            for prep in stale:
                self._discard(prep, "it is no longer among the next queued jobs")
            busy, _ = self.busy()
            if busy == 0 or len([j for j in window if j.job_id in self._preps]) >= busy:
                return None
            if self.contended():  # a worker runs its own host steps (a host job beside a compile): a prep would only
                return None  # start its child and yield at once, again and again; its step changes wake us

            return next((j for j in window if j.job_id not in self._preps), None)

    # -- preparing -----------------------------------------------------------------------------
    def _prepare(self, job: Job) -> None:
        work = work_dir(self.config.work_root, job)  # the one its worker will use (made fresh below)
        prep = Prep(job.job_id, job.attempt, ahead.doc_digest(job.entry), work, beside=self.busy()[1])
        with self._cond:  # take() holds this lock too: a job a slot took meanwhile is never prepared under it
            now = self.store.get(job.job_id)
            if now is None or now.state != QUEUED or now.attempt != job.attempt:
                return  # taken (its worker runs the host steps in that work dir), cancelled, or moved on
            self._preps[job.job_id] = prep
        started = time.monotonic()
        try:
            entry = entry_from_doc(job.entry)
            policy = PathPolicy((Path(job.claim_dir), self.inbox, *self.config.allowed_roots))
            limits = self.config.limits
            prep.inputs = ahead.fingerprint([entry.onnx, entry.calib])
            work = fresh_work_dir(self.config.work_root, job)
            prep.work_dir = work
            result = child.run(ahead.host_steps, (entry, work, policy, limits.max_onnx_bytes), "prepare",
                               float(limits.step_timeout_s), lambda: self._interrupted(prep),
                               (limits.child_memory_bytes, "ONNX_INVALID"))
            images = ahead.fingerprint([s.image for s in result.chosen])
        except Exception as exc:  # any failure: the job runs the steps itself and reports what they find
            self._failed(prep, f"{type(exc).__name__}: {exc}", getattr(exc, "fields", {}).get("reason") == YIELD)
            return
        with self._cond:
            prep.result, prep.images = result, images
            prep.seconds, prep.finished_at, prep.running = time.monotonic() - started, jobid.iso(jobid.utc_now()), False
            self._cond.notify_all()
        event("job.prepared", job, error_code=None, seconds=round(prep.seconds, 3), beside=prep.beside or None)

    def _failed(self, prep: Prep, message: str, again: bool = False) -> None:
        with self._cond:  # kept without a result, so that it is not tried again while its job waits
            remove_work(prep.work_dir)
            prep.running = False
            if again and prep.taken is None:  # it only yielded: prepared again when a slot compiles
                del self._preps[prep.job_id]
            self._cond.notify_all()
        log.debug("job.prep_discarded", job_id=prep.job_id, reason=message)

    def _interrupted(self, prep: Prep) -> str | None:
        """Why the prep in progress must end: a stop, its job's own stop or cancel once taken, else its job left the
        queue (cancelled) or the window (pushed back by a job of higher priority)."""
        if self.stop_event.is_set():
            return "stop"
        if prep.taken is not None:
            return prep.taken()
        if self.contended():
            return YIELD
        ids = {j.job_id for j in self.store.head(QUEUED, self.slots)}
        return None if prep.job_id in ids else "cancel"

    # -- handing over --------------------------------------------------------------------------
    def take(self, job: Job, interrupted: Callable[[], str | None]) -> Prep | None:
        """The job's prep, usable for this attempt (one in progress is waited for: from now on the job's own stop or
        cancel ends it); None: run the host steps now (its work folder is then gone)."""
        with self._cond:
            prep = self._preps.get(job.job_id)
            if prep is None:
                return None
            prep.taken = interrupted
            while prep.running:  # the preparer's child looks at `interrupted` every child.POLL_S
                self._cond.wait(TAKE_POLL_S)
            del self._preps[job.job_id]
            why = prep.unusable(job.attempt, ahead.doc_digest(job.entry), entry_from_doc(job.entry))
            if why is None:
                return prep
            remove_work(prep.work_dir)
        log.debug("job.prep_discarded", job_id=job.job_id, reason=why)
        return None

    def _discard(self, prep: Prep, why: str) -> None:
        """Forget a prep and remove its work folder (called with the lock held: the worker never sees it half gone)."""
        del self._preps[prep.job_id]
        remove_work(prep.work_dir)
        log.debug("job.prep_discarded", job_id=prep.job_id, reason=why)

    def _discard_all(self, why: str) -> None:
        with self._cond:
            for prep in [p for p in self._preps.values() if p.taken is None and not p.running]:
                self._discard(prep, why)

"""A worker: runs the queued jobs of its slot one at a time and settles each one (publish, requeue or fail)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from saigeedged import jobid
from saigeedged.adapters.docker import Containers
from saigeedged.adapters.events import event
from saigeedged.adapters.joblog import JobLog
from saigeedged.compile import ahead, pipeline
from saigeedged.compile.inputs import PathPolicy
from saigeedged.config import Config
from saigeedged.errors import SaigeError, out_of_attempts
from saigeedged.jobs import (
    RUNNING,
    SUCCEEDED,
    Attempt,
    Job,
    Superseded,
    bundle_rel,
    end_attempt,
    entry_from_doc,
    remaining_s,
    spent,
)
from saigeedged.service import room
from saigeedged.service.attempt import Facts
from saigeedged.service.decision import DETACH, END, HOLD, decide
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.progress import Progress
from saigeedged.service.slot import Slot, attempt_dir, fresh_work_dir, remove_work, work_dir
from saigeedged.service.stages import Ahead, Finishing

log = structlog.get_logger()
IDLE_S = 1.0  # an idle worker looks at the queue this often when nothing wakes it
CANCEL_GRACE_S = 2.0  # a cancelled job whose worker is in an engine call this long ends now, its step killed later


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
        containers.interrupted = self._cancelled  # what the containers' steps end by: never a file a step wrote
        self.wake = wake or threading.Event()  # shared by the workers of a pool: a claim wakes them all
        self.stop_event = threading.Event()
        self.current: Job | None = None
        self.work: Path | None = None  # the current job's work dir
        self._reason: str | None = None
        self._lock = threading.Lock()
        self.ahead: Ahead | None = None  # set by the daemon: host steps of queued jobs done while one compiles
        # running jobs whose container step outlived the daemon before this one, or its engine's outage: re-attached
        # (the same attempt goes on) before this worker takes anything new
        self.resumable: list[Job] = []
        self.attempt: Attempt | None = None  # the current job's attempt: the store must still name it to write
        self.facts = Facts(jobs.store, lambda: self.attempt)  # its record in the store
        containers.book = self.facts  # its steps' exec ids and log offsets go there too
        self.kept = False  # the current attempt's work dir stays: its step runs on, or is the monitor's to reap
        self.finisher: Finishing | None = None  # takes jobs after their last container step or compile (None: not)
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
                self.jobs.abandon(job, exc, self.attempt)
                self.stop_event.wait(1.0)  # if the job could not be settled either, do not spin on it

    def _take(self) -> tuple[Job | None, bool, pipeline.Compiled | None]:
        """The next job: one to re-attach, else the first queued one of this slot's targets."""
        resumed = self._next_resumable()
        return resumed or self.jobs.store.next_queued(self.slot.skip()), resumed is not None, None

    def _next_resumable(self) -> Job | None:
        """A job to re-attach, once its engine answers; None when there is none (or it is not running any more)."""
        while True:
            with self._lock:  # the engine monitor moves held jobs elsewhere from its own thread
                held = next((j for j in self.resumable if self.slot.can_reattach(j.target)), None)
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
            if self._reason == reason or self._reason == "cancel":
                return  # already asked (the main loop sees a cancel request until the job ends); a stop never
                # turns a cancel into a detach: the job ends cancelled
            job, self._reason = self.current, reason
        container, work = self.containers.active, self.work
        if reason != "stop" and job is not None and container is not None and work is not None:
            threading.Thread(target=container.interrupt, args=(work, reason),
                             name="saigeedged-interrupt", daemon=True).start()

    def _cancelled(self) -> str | None:
        """Why the running job's container steps end: the worker's reason, or a cancel the store holds that the main
        loop has not passed on yet (a job re-attached after a restart, cancelled while no daemon ran)."""
        reason, job = self._reason, self.current
        if reason != "cancel" and job is not None and self.jobs.store.cancel_requested(job.job_id):
            return "cancel"
        return reason

    def stop(self) -> None:
        """Stop taking jobs; the attempts of this worker are left on purpose, whether it returns in time or is still
        inside an engine call when the daemon exits: recorded as detached at once, so none counts as a crash."""
        self.stop_event.set()
        self.wake.set()
        self.interrupt("stop")
        for job in self.owned():
            self.facts.detach(job)

    def _start(self, job: Job) -> Job | None:
        """Take `job` if it is still queued and not cancelled: one conditional write (Store.take), so of the workers
        that saw it only one runs it; the job as taken (its attempt opened), else None."""
        before = job.attempts[-1]["engine"] if job.attempts else None
        taken = self.jobs.take(job.job_id, self.slot.engine_of(job.target),
                               str(attempt_dir(self.config.work_root, job)))
        if taken is None:
            return None  # cancelled by `saigeedged cancel` meanwhile, or taken by another slot
        self._own(taken)
        event("job.started", taken, attempt=taken.attempt, engine=taken.engine)
        after = taken.attempts[-1]["engine"]
        if before is not None and before != after:
            event("job.moved", taken, "warning", from_engine=before, to_engine=after)
        self.on_change()
        return taken

    def _own(self, job: Job) -> Job:
        """`job` is this worker's now; its attempt is the fence of every write it makes (SPEC §15)."""
        with self._lock:
            # a stop asked for just before the job was taken is not erased: the job stops before its first step
            self.current, self._reason = job, "stop" if self.stop_event.is_set() else None
            self.kept, self.handed_off, self.attempt = False, False, Attempt.of(job)
        return job

    def execute(self, queued: Job, resumed: bool = False, handed: pipeline.Compiled | None = None) -> None:
        """Take the job (or re-attach to its running attempt, or go on with one handed over after its last container
        step), run it, settle it; every write fenced by the attempt."""
        job = self._reattach(queued) if resumed else self._own(queued) if handed else self._start(queued)
        if job is None:
            return
        attempt = self.attempt
        assert attempt is not None
        new = not resumed and handed is None
        prepared = self.ahead.take(job, lambda: self._reason) if self.ahead and new else None  # made in `work`
        fresh = prepared is None and new
        work = self.work = attempt_dir(self.config.work_root, job) if fresh else work_dir(self.config.work_root, job)
        try:
            try:
                if fresh:
                    fresh_work_dir(self.config.work_root, job)
                joblog = JobLog(self.places.local_log(job.job_id), lambda: self.jobs.still_current(attempt))
            except OSError as exc:  # state_dir full (waited out), else a bug for the run loop's guard
                if not room.full(exc):
                    raise
                self.kept = self._settle(job, SaigeError("INTERNAL", f"state_dir is full: {exc}", state_full=True)) \
                    or self.kept
                return
            try:
                if handed is None:
                    joblog.line(f"### {job.job_id} attempt {job.attempt} on {job.engine or 'this host'}"
                                + (f", re-attached in step {job.step}" if resumed else ""))
                host = ahead.Ready(prepared, joblog) if prepared else self.facts.replay(job, joblog) if resumed else None
                self._run(job, work, joblog, host, queued.step_index if resumed else 0, handed)
                joblog.close()
                if not self.handed_off:
                    self._succeed(job)
            except SaigeError as exc:
                with contextlib.suppress(Superseded):
                    joblog.line(f"### {'stopped' if exc.stop else exc.code}: {exc.message}")
                joblog.close()
                self.kept = self._settle(job, exc) or self.kept
        except Superseded as exc:  # the store names another attempt now (moved, cancelled): this one writes nothing
            log.info("job.superseded", job_id=job.job_id, job_name=job.name, message=str(exc))
            self.kept = True  # whatever still runs there is the monitor's to reap
        finally:
            self.containers.release(None if self.kept else work)
            with self._lock:
                self.current, self.work = None, None
            self.on_change()
            if not self.config.keep_work and not self.kept and not self.handed_off:
                remove_work(work)  # kept: a step that runs on (re-attached), one to reap, or the finishing stage's

    def _reattach(self, job: Job) -> Job:
        """Go on with a running job's attempt: its step outlived the last daemon or an outage of its engine."""
        self._own(job)
        job.error = None  # the outage it waited through, if any, is over
        event("job.reattached", job, attempt=job.attempt, engine=job.engine, index=job.step_index, count=job.step_count)
        self.on_change()
        return job

    def _succeed(self, job: Job) -> None:
        self.jobs.end(job, SUCCEEDED, fence=Attempt.of(job))  # (the end closes its attempt)

    def _run(self, job: Job, work: Path, joblog: JobLog, host: ahead.Replay | None = None, replayed: int = 0,
             handed: pipeline.Compiled | None = None) -> None:
        """`replayed`: the index of the step a re-attached attempt was in (Progress logs no `job.step` up to it)."""
        entry, rel = entry_from_doc(job.entry), bundle_rel(job)
        policy = PathPolicy((Path(job.claim_dir), self.places.inbox, *self.config.allowed_roots))

        limits, attempt = self.config.limits, self.attempt
        assert attempt is not None
        if handed is None and job.finishing:  # re-attached after a hand-over (a restart, a finisher's hold): back in
            self.jobs.mark_finishing(job, attempt, False)  # its slot, which replays its steps and hands it over again
        told = Progress(self.jobs, job, attempt, rel, self.on_change, lambda: self._reason, limits.publish_patience_s,
                        replayed)
        run = pipeline.Job(job.job_id, entry, work, joblog, self.config, policy, told.step, told.progress, told.inputs,
                           container=self.containers.get, interrupted=lambda: self._reason, host=host,
                           # the job timeout counts the attempt's whole life, re-attaches included
                           deadline=time.monotonic() + remaining_s(job.attempts[-1]["started_at"], jobid.utc_now(),
                                                                   limits.job_timeout_s),
                           current=lambda: self.jobs.still_current(attempt), on_prepared=self.facts.prepared)
        if handed is not None:
            result: pipeline.Result | None = pipeline.finish(run, handed, told.publish, job.created_at)
        else:
            result = pipeline.run(run, told.publish, job.created_at, lambda compiled: self._hand_off(job, compiled))
        if result is None:
            return  # the finishing stage's now
        job.onnx_sha256, job.calib_samples, job.report = result.onnx_sha256, result.calib_samples, result.report
        if result.report and result.report.get("flagged"):
            event("job.quantization_flagged", job, "warning", outputs=",".join(result.report["flagged"]))

    def _hand_off(self, job: Job, compiled: pipeline.Compiled) -> bool:
        """Give a job past its compile to the finishing stage (True), so this slot is free: a container job's next
        compile, or a host job's (its compile is the host's own serial work), never waits for a report, nor for an
        outbox that refuses bundles (a job without a report is handed over too: its publication may wait an hour)."""
        if self.finisher is None:
            return False
        if not compiled.plans and self.config.executor.kind != "local":
            return False  # on a Slurm node the hand-over ends the cluster job: a stop while the bundle waited for the
            # outbox would then have the next start wait for a node to replay the steps of a bundle already built
        if self.attempt is None or not self.jobs.still_current(self.attempt):
            raise Superseded(f"{job.job_id}: attempt {job.attempt} is not the store's any more")
        left = None
        if any(planned.simulator for planned in compiled.plans):  # its call runs beside this slot's next job
            active = self.containers.active
            left = None if active is None else active.beside()
            if left is None:
                return False
        # recorded before the hand-over (a finisher may write or end the job at once), undone if it is refused: the
        # slot then shows the job this worker runs, never one it handed over (statusline.finishing)
        self.jobs.mark_finishing(job, self.attempt, True)
        with self._lock:  # a stop or cancel that came first keeps the job here (the stage's stop may have swept already)
            handed = self._reason is None and self.finisher.hand(job, compiled, left, lambda: event("job.finishing", job))
            self.handed_off = handed
        if not handed:  # this worker makes its report, bundle and publication itself: its slot shows it
            self.jobs.mark_finishing(job, self.attempt, False)
        return handed

    def _settle(self, job: Job, exc: SaigeError) -> bool:
        """Settle an attempt that did not succeed as decision.decide says; every write is fenced by the job's attempt
        (Superseded when the store names another one). True: its work dir stays (a step runs on in it, the monitor
        reaps it, or state_dir was full)."""
        fence = Attempt.of(job)
        # started: a container step may run, or what the attempt runs in outlives the daemon (a queued cluster job)
        full = bool(exc.fields.get("state_full"))
        started = self.facts.step_may_run(job) or bool(exc.fields.get("detached"))
        done = decide(exc.code, exc.fields.get("reason"), exc.retryable, bool(exc.fields.get("exhausted")),
                      spent(job), self.config.limits.max_attempts, started, full)
        kept = full or exc.code == "DOCKER_UNAVAILABLE"  # the latter: whatever may still run there is the monitor's
        if full:  # not the job's fault: it goes on (or back to the queue) once state_dir has room again
            room.wait_for_disk(self.config.work_root, self.jobs.store.wait_for_room, exc.message)
        if exc.code == "DOCKER_UNAVAILABLE":
            self.slot.on_lost(exc.message)
        # given up: an attempt that cannot go on, or one that ends by a cancel or timeout whose kill may not have
        # reached its step (a cancel that came while a re-attached attempt replayed its ended steps ends the job before
        # the running one is attached): the monitor kills what still runs there. On a Slurm partition the cancel's
        # scancel ends the cluster job, and the attempt's end (its folder's done marker, then the folder removed) makes
        # the node's agent kill the step: no reap is recorded there, no engine monitor would do it.
        local = self.config.executor.kind == "local"
        killed_late = done.action == END and exc.code in ("CANCELLED", "TIMEOUT") and started
        if local and (exc.fields.get("unresumable") or killed_late):
            kept = True
            self.facts.give_up(job)
        if done.action == DETACH:
            self.facts.detach(job)
            event("job.detached", job, attempt=job.attempt)
            return True
        if done.action == HOLD:
            self._keep_running(job, exc)
            return True
        stopped = done.reason == "stop"  # a stop is no error of the attempt's (it was counted CANCELLED)
        end_attempt(job, jobid.iso(jobid.utc_now()), None if stopped else exc.code, stopped)
        if done.action == END:
            self.jobs.end(job, done.reason, out_of_attempts(exc), fence=fence)
            return kept
        if done.recreate:
            self.containers.container(job.target).recreate()  # it died under the job: made afresh
        self.jobs.requeue(job, done.reason, None if stopped else exc, spend_attempt=done.spend,
                          fence=fence)
        return kept

    def lose(self, reason: str, elsewhere: Callable[[str], bool]) -> list[Attempt]:
        """The engine is down: the jobs of this worker that wait on it and whose target another ready engine serves
        (`elsewhere`) are requeued (ENGINE_LOST) now, from the watching thread; the store's fence keeps whatever those
        attempts do later from landing. Returns those attempts (their steps are killed when the engine answers)."""
        with self._lock:
            moved = [j for j in self.resumable if elsewhere(j.target)]  # waiting to re-attach: moved instead
            self.resumable = [j for j in self.resumable if j not in moved]
            job, active = self.current, self.containers.active
        if job is not None and active is not None and active.calls and elsewhere(job.target):
            moved.append(job)  # inside a call to the engine: it is not waiting for a write of ours
        return [fence for held in moved if (fence := self._settle_now(held, SaigeError(
            "ENGINE_LOST", f"engine {held.engine} stopped answering: {reason}", step=held.step))) is not None]

    def owned(self) -> list[Job]:
        """The jobs of this worker: the one it runs and those waiting for their engine to re-attach."""
        with self._lock:
            return [j for j in [self.current, *self.resumable] if j is not None]

    def cancel(self, job_id: str) -> list[Attempt]:
        """`saigeedged cancel` wins at once, whatever the engine's state: the running step is killed now; a job held
        for its engine, or one whose worker is inside an engine call that does not return, ends cancelled now and its
        step is killed when the engine answers (the attempts returned, for the reap)."""
        with self._lock:
            held = next((j for j in self.resumable if j.job_id == job_id), None)
            if held is not None:
                self.resumable.remove(held)
            current, active = self.current, self.containers.active
        job = held or (current if current is not None and current.job_id == job_id else None)
        if job is None:
            return []
        if held is None:
            self.interrupt("cancel")
            if active is None or active.busy_s() < CANCEL_GRACE_S:
                return []  # the kill reaches the step and the worker ends the job itself
        why = ("cancelled before its step was re-attached (after a restart, or while its engine did not answer): the "
               "step is killed once its engine answers" if held is not None else
               "cancelled while its engine did not answer: its step is killed when it does")
        fence = self._settle_now(job, SaigeError("CANCELLED", why, reason="cancel", step=job.step))
        return [] if fence is None else [fence]

    def _settle_now(self, job: Job, exc: SaigeError) -> Attempt | None:
        """Settle the attempt `job` is on from another thread (the monitor's, the main loop's), from the row as stored
        (the worker's own copy is its thread's); None when the store names another attempt already."""
        stored = self._stored_running(job)
        if stored is None:
            return None
        try:
            kept = self._settle(stored, exc)
        except Superseded:
            return None
        with self._lock:  # the work dir of the job this worker runs stays; a held job's is not the current one's
            if kept and self.current is not None and Attempt.of(self.current) == Attempt.of(job):
                self.kept = True
        return Attempt.of(job)

    def _stored_running(self, job: Job) -> Job | None:
        """The row of `job` as stored, while it is still running on the attempt `job` is on; else None."""
        stored = self.jobs.store.get(job.job_id)
        return stored if stored is not None and stored.state == RUNNING and Attempt.of(stored) == Attempt.of(job) \
            else None

    def _keep_running(self, job: Job, exc: SaigeError) -> None:
        """The engine is unreachable and the job's step may run on: it stays running (the reason in its status file,
        no attempt spent) and re-attaches once the engine answers; the engine monitor decides whether it moves to
        another engine (SPEC §15)."""
        job.error = exc.as_dict(job.step)
        self.jobs.save(job, fence=Attempt.of(job))
        event("job.waiting", job, "warning", error_code=exc.code, message=exc.message, engine=job.engine)
        self._hold(job)

    def _hold(self, job: Job) -> None:
        """A job held for its engine (or for room in state_dir) is this worker's to re-attach."""
        self.adopt(job)

    def adopt(self, job: Job) -> None:
        """Re-attach `job` (a running attempt) when this slot can: at a start, or held by the finishing stage."""
        with self._lock:  # the engine monitor rebuilds the list from its own thread (lose)
            if job.job_id not in {j.job_id for j in self.resumable}:  # a start-up tried again (state_dir full)
                self.resumable.append(job)

"""The job lifecycle: each transition's row, status file, log, inputs and journal event, in that order."""

from __future__ import annotations

import shutil
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog

from saigeedged import files, jobid
from saigeedged.adapters.events import event
from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import ENDING, Store
from saigeedged.errors import SaigeError
from saigeedged.guards import headline
from saigeedged.intake import ownfolders
from saigeedged.jobs import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    Attempt,
    CancelWins,
    Job,
    Superseded,
    end_attempt,
)

log = structlog.get_logger()
ENDED = {SUCCEEDED: "job.succeeded", FAILED: "job.failed", CANCELLED: "job.cancelled"}


@dataclass
class Places:
    """The daemon's directories."""

    inbox: Path
    state_dir: Path

    def make(self, outbox: Path) -> None:
        """Create the inbox, the outbox, the state dir and the daemon's own folders, or say which cannot be made."""
        for folder in (self.inbox, outbox, self.state_dir, self.claimed, self.failed):
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SaigeError("PUBLISH_FAILED", f"cannot create {folder}: {exc.strerror}",
                                 hint="check the inbox/outbox shares are mounted and writable by the service user; "
                                 "`saigeedged check` lists them") from None

    @property
    def claimed(self) -> Path:
        return self.inbox / files.OWN_DIR / "claimed"

    @property
    def failed(self) -> Path:
        return self.inbox / files.OWN_DIR / "failed"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    def local_log(self, job_id: str) -> Path:
        return self.logs / f"{job_id}.log"


class _JobLock:
    """A job's own lock (reentrant: a write inside `Jobs.holding` takes it again); weakly kept, so it goes with the
    last thread holding it."""

    __slots__ = ("lock", "__weakref__")

    def __init__(self) -> None:
        self.lock = threading.RLock()


class Jobs:
    """Job transitions with their side effects: the row, the status file, the journal event.

    The row is the truth. What the outbox refuses (a full or unmounted share) is remembered in the database and
    written by catch_up() once the outbox takes it, so a `succeeded` or `failed` is never stuck unseen as `running`,
    across restarts too.
    """

    def __init__(self, store: Store, outbox: Outbox, places: Places) -> None:
        self.store, self.outbox, self.places = store, outbox, places
        self._writing = threading.Lock()  # a row and its status file are written together, by one thread at a time
        # each job's writes, one thread at a time, taken before _writing: a publish held under `holding` blocks a
        # requeue of that job only, never the other jobs' status files
        self._jobs: weakref.WeakValueDictionary[str, _JobLock] = weakref.WeakValueDictionary()
        self._jobs_guard = threading.Lock()
        self.observers: list[Callable[[Job], None]] = []  # told of every saved change (the ops surfaces); must not block

    @contextmanager
    def _job(self, job_id: str) -> Iterator[None]:
        with self._jobs_guard:
            held = self._jobs.get(job_id)
            if held is None:
                held = self._jobs[job_id] = _JobLock()
        with held.lock:
            yield

    def take(self, job_id: str, engine: str, work: str = "") -> Job | None:
        """Run a queued job on `engine` (Store.take) and write its status file; None when another slot took it or it
        was cancelled meanwhile. The attempt to fence its later writes with is `Attempt.of(job)`."""
        with self._job(job_id), self._writing:
            job = self.store.take(job_id, engine, jobid.iso(jobid.utc_now()), work)
            if job is not None:
                self._write_status(job)
        if job is not None:
            self._carry_log(job)
            self._observe(job)
        return job

    def _carry_log(self, job: Job) -> None:
        """A job run again after it ended (`saigeedged retry`) goes on in the log its earlier attempts left in the
        outbox: its end moves the local log there, which must hold every attempt (a requeued job's never left)."""
        local = self.places.local_log(job.job_id)
        if job.attempt == 1 or local.exists():
            return
        try:
            self.outbox.fetch_log(job.job_id, local)
        except OSError as exc:  # the share refuses it: this attempt's end replaces that log
            log.warning("log.fetch_failed", job_id=job.job_id, job_name=job.name, message=f"the log of the earlier "
                        f"attempts cannot be read from the outbox ({exc}): this attempt's log replaces it")

    def still_current(self, attempt: Attempt) -> bool:
        """Does the store still name this attempt (running)? A stale attempt must not publish or record anything."""
        return self.store.still_current(attempt)

    @contextmanager
    def holding(self, attempt: Attempt) -> Iterator[None]:
        """Hold the job's writes while the store names `attempt`, else raise Superseded: a bundle published (or a
        log moved) inside cannot interleave with a requeue or a move of the job to another attempt."""
        with self._job(attempt.job_id):
            if not self.store.still_current(attempt):
                raise Superseded(f"job {attempt.job_id}: attempt {attempt.attempt} on {attempt.engine} is over")
            yield

    def save(self, job: Job, expect: str | None = None, fence: Attempt | None = None, touch: bool = True) -> None:
        """The row, then its status file (only once the row is written); `fence`: see Store.save (Superseded).
        `touch`: the change is now (updated_at); an end keeps the time its row was first written with."""
        if touch:
            job.updated_at = jobid.iso(jobid.utc_now())
        with self._job(job.job_id), self._writing:
            self.store.save(job, expect, fence)
            self._write_status(job)
        self._observe(job)

    def mark_finishing(self, job: Job, attempt: Attempt, handed: bool) -> None:
        """`job` (its attempt `attempt`) is handed to the finishing stage, or back in its slot (Job.finishing): the row
        says so at once (`status`, the dashboard); its status file does not carry it. Superseded: see Store.save."""
        job.finishing = handed
        with self._job(job.job_id):
            self.store.mark_finishing(attempt, handed)
        self._observe(job)

    def add(self, job: Job) -> None:
        """A new row and its first status file, together: the worker may take the job the moment the row exists."""
        with self._writing:
            self.store.add(job)
            self._write_status(job)
        self._observe(job)

    def _observe(self, job: Job) -> None:
        for observe in self.observers:
            observe(job)

    def behind(self) -> bool:
        """Has the outbox refused a file that catch_up() still has to write?"""
        return bool(self.store.behind("status") or self.store.behind("log") or self.store.behind("event"))

    def _write_status(self, job: Job) -> None:
        """The status file; called with the row lock held, so the durable "behind" mark matches the last write."""
        try:
            self.outbox.write_status(job)
        except SaigeError as exc:
            if job.job_id not in self.store.behind("status"):
                log.error("status.write_failed", job_id=job.job_id, job_name=job.name, error_code=exc.code,
                          message=exc.message)
                self.store.mark_behind(job.job_id, "status")
        else:
            self.store.status_written(job.job_id)

    def move_log(self, job: Job) -> None:
        """The ended job's log from state_dir to the outbox (later, by catch_up(), if the outbox refuses it)."""
        try:
            self.outbox.move_log(self.places.local_log(job.job_id), job.job_id)
        except SaigeError as exc:
            log.error("log.move_failed", job_id=job.job_id, job_name=job.name, error_code=exc.code, message=exc.message)
            self.store.mark_behind(job.job_id, "log")

    def strand(self, job_ids: list[str]) -> None:
        """Jobs whose log never left state_dir (the outbox refused it before a restart): catch up on both files."""
        for job_id in job_ids:
            self.store.mark_behind(job_id, "log")
            self.store.mark_behind(job_id, "status")

    def catch_up(self) -> list[str]:
        """Write the files the outbox refused, and announce the ends a command made (`saigeedged cancel` of a queued
        job: the operator's shell has no journal). Each kind stops at its first refusal (the next round goes on from
        there) without holding up the others: a status folder that refuses files never keeps a log from the outbox.
        The jobs whose ends it announced."""
        announced = []
        for kind, one in (("status", self._status_again), ("log", self._log_again), ("event", self._announce)):
            try:
                for job_id in self.store.behind(kind):
                    one(job_id)
                    log.info(f"{kind}.caught_up", job_id=job_id)
                    if kind == "event":
                        announced.append(job_id)
            except SaigeError:
                pass  # still refused: the next round tries again
        return announced

    def _status_again(self, job_id: str) -> None:
        with self._writing:  # the mark is cleared under the lock: a newer refused write would set it again
            job = self.store.get(job_id)
            if job is not None:
                self.outbox.write_status(job)
            self.store.status_written(job_id)

    def _log_again(self, job_id: str) -> None:
        job = self.store.get(job_id)
        if job is not None and job.state in TERMINAL:  # a retried job moves its log at its end (its attempt took this one on)
            self.outbox.move_log(self.places.local_log(job_id), job_id)
        self.store.mark_behind(job_id, "log", False)

    def _announce(self, job_id: str) -> None:
        job = self.store.get(job_id)
        if job is not None and job.state in TERMINAL:
            said = headline(str(job.error["message"])) if job.error and job.error.get("message") else None
            event(ENDED[job.state], job, "info" if job.state == SUCCEEDED else "warning", message=said)
        self.store.mark_behind(job_id, "event", False)

    def requeue(self, job: Job, reason: str, error: SaigeError | None = None, spend_attempt: bool = True,
                fence: Attempt | None = None) -> None:
        """Back to the queue; the status file's `error` says why the last attempt did not finish.

        A job `saigeedged cancel` flagged while it ran ends cancelled instead: a cancel is never lost to a requeue.
        """
        with self._job(job.job_id):
            was = job.state, job.step, job.step_index, job.attempt, job.error
            took = [dict(a) for a in job.attempts]
            job.error = error.as_dict(job.step) if error else None
            job.state, job.step, job.step_index = QUEUED, None, 0
            job.attempt += 1 if spend_attempt else 0
            job.updated_at = jobid.iso(jobid.utc_now())
            # an attempt still open ends here (a worker ends its own first): the daemon died under it (a restart's
            # requeue), so `status` never shows a queued job's attempt as running "since"
            end_attempt(job, job.updated_at, error.code if error else "INTERNAL")
            try:
                with self._writing:  # the row first: the journal never tells of a requeue the store refused
                    self.store.save(job, fence=fence)
            except CancelWins:
                job.state, job.step, job.step_index, job.attempt, job.error = was
                job.attempts = took  # (the end closes its attempt, as the cancel's)
                self.end(job, CANCELLED, SaigeError("CANCELLED", f"cancelled while running (the attempt ended: {reason})",
                                                    step=job.step), fence=fence)
                return
            except BaseException:  # not written (Superseded, StoreFull): the caller's job is as it was, to try again
                job.state, job.step, job.step_index, job.attempt, job.error = was
                job.attempts = took
                raise
            event("job.requeued", job, "warning", reason=reason, error_code=error.code if error else None,
                  message=error.message if error else None)  # why the attempt ended, for whoever reads the journal
            with self._writing:
                self._write_status(job)  # the status file last, as for every transition
        self._observe(job)

    def settle_inputs(self, job: Job) -> None:
        """After the last job of a claimed folder ends: delete it if all succeeded, else keep it under failed/."""
        sharing = [job if j.job_id == job.job_id else j for j in self.store.by_claim(job.claim_dir)]
        if any(j.state in (QUEUED, RUNNING) for j in sharing):
            return
        claim = Path(job.claim_dir)
        if all(j.state == SUCCEEDED for j in sharing):
            shutil.rmtree(claim, ignore_errors=True)
            return
        self.relocate([j for j in sharing if j.state != SUCCEEDED], self.places.failed / claim.name)

    def _settle_inputs_of_end(self, job: Job) -> None:
        try:
            self.settle_inputs(job)
        except OSError as exc:  # the inputs stay where they are; the job's end is still written
            log.error("inputs.settle_failed", job_id=job.job_id, job_name=job.name, error_code="INTERNAL",
                      message=f"{job.claim_dir}: {exc}")

    def relocate(self, jobs: list[Job], dest: Path) -> None:
        """Move the jobs' claimed folder (they share one) to `dest` and point their rows at it."""
        claim = Path(jobs[0].claim_dir)
        if claim.exists() and claim != dest:
            ownfolders.move(claim, dest, self.places.inbox)
        for job in jobs:
            job.entry["onnx"] = job.entry["onnx"].replace(str(claim), str(dest), 1)
            job.claim_dir = str(dest)
            self.store.save(job)

    def end(self, job: Job, state: str, error: SaigeError | None = None, expect: str | None = None,
            announce: bool = True, fence: Attempt | None = None) -> None:
        """A terminal state: the row; the log, the inputs and the journal event; and last the status file.

        So whoever reads the final status finds the log in the outbox, the inputs deleted or under failed/.
        `fence`: the row must still name that attempt, running (else Superseded, and nothing moves).
        """
        with self._job(job.job_id):
            self._end(job, state, error, expect, announce, fence)

    def _end(self, job: Job, state: str, error: SaigeError | None, expect: str | None, announce: bool,
             fence: Attempt | None) -> None:
        job.state, job.finished_at = state, jobid.iso(jobid.utc_now())
        job.updated_at = job.finished_at  # whoever reads the ended row before its status file is written (a webhook
        # sender seeing a shell's cancel) reads what the status file will say
        job.error = error.as_dict(error.fields.get("step")) if error else None
        end_attempt(job, job.finished_at, error.code if error else None)  # an attempt left open (the daemon died under
        # it, a cancel beat a requeue) ends with the job: never "since" on an ended job
        # the row first: `expect` and the fence are checked before anything moves, and a crash once the inputs are
        # deleted does not run the job again. The row is marked `ending` with it (Store.save) until its status file
        # says so: a daemon killed in between (the row ended, its log moved, the status file still `running`) has the
        # next start write it
        with self._writing:
            self.store.save(job, expect, fence)
        self.move_log(job)
        self._settle_inputs_of_end(job)
        if announce:
            event(ENDED[state], job, "info" if state == SUCCEEDED else "warning",
                  message=headline(error.message) if error else None)
        else:  # a command's end (not the daemon's): the daemon's next round says it in the journal
            self.store.mark_behind(job.job_id, "event")
        self.save(job, expect=state if fence else None, fence=fence, touch=False)  # still this attempt's end (a retry
        # may follow)

    def ended_unwritten(self) -> None:
        """At start: jobs the last daemon ended whose status file it may not have written (killed in between) have it
        written by the catch-up; an end that did not happen (its row still running) is the recovery's."""
        for job_id in self.store.behind(ENDING):
            job = self.store.get(job_id)
            if job is not None and job.state in TERMINAL:
                self._settle_inputs_of_end(job)  # the kill may have come before: deleted, or under failed/, first
                self.store.mark_behind(job_id, "status")
            self.store.mark_behind(job_id, ENDING, False)

    def abandon(self, job: Job, exc: Exception, attempt: Attempt | None) -> None:
        """Mark a job that hit a bug failed (INTERNAL) so the queue moves on, fenced by `attempt`, the one its worker
        ran (a job moved or cancelled meanwhile is left to whoever has it now); never raises."""
        error = SaigeError("INTERNAL", f"{type(exc).__name__}: {exc}")
        try:
            current = self.store.get(job.job_id)
            if current is None or current.state not in (QUEUED, RUNNING):
                return
            if current.state == QUEUED:  # it failed before it was taken (e.g. its row cannot be read as a job)
                current.state = RUNNING
                self.store.save(current, expect=QUEUED)
                self.end(current, FAILED, error)
            elif attempt is not None and Attempt.of(current) == attempt:
                self.end(current, FAILED, error, fence=attempt)
        except Exception as again:  # the store or the outbox itself is broken: leave the row for the next start
            log.error("job.internal_error", job_id=job.job_id, message=f"cannot settle: {again}")

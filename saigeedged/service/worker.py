"""The single worker: runs queued jobs one at a time and settles each one (publish, requeue or fail)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from saigeedged import jobid
from saigeedged.adapters.container import Container, Containers
from saigeedged.adapters.joblog import JobLog
from saigeedged.adapters.publish import Outbox
from saigeedged.adapters.store import Store
from saigeedged.compile import pipeline
from saigeedged.compile.inputs import PathPolicy
from saigeedged.config import Config
from saigeedged.errors import SaigeError
from saigeedged.intake import ownfolders
from saigeedged.jobs import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, TERMINAL, Job, TransitionError, entry_from_doc
from saigeedged.service.outage import DOCKER_TARGETS, Outage
from saigeedged.service.publishing import publish_patiently

log = structlog.get_logger()
ENDED = {SUCCEEDED: "job.succeeded", FAILED: "job.failed", CANCELLED: "job.cancelled"}


def event(name: str, job: Job, level: str = "info", **fields: Any) -> None:
    """One journal entry for a job event, with the SPEC §9 fields."""
    fields.setdefault("error_code", (job.error or {}).get("code"))
    getattr(log, level)(name, job_id=job.job_id, job_name=job.name, state=job.state, step=job.step, **fields)


@dataclass
class Places:
    """The daemon's directories."""

    inbox: Path
    state_dir: Path

    @property
    def claimed(self) -> Path:
        return self.inbox / ".saigeedged" / "claimed"

    @property
    def failed(self) -> Path:
        return self.inbox / ".saigeedged" / "failed"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    def local_log(self, job_id: str) -> Path:
        return self.logs / f"{job_id}.log"


class Jobs:
    """Job transitions with their side effects: the row, the status file, the journal event.

    The row is the truth. What the outbox refuses (a full or unmounted share) is remembered in the database and
    written by catch_up() once the outbox takes it, so a `succeeded` or `failed` is never stuck unseen as `running`,
    across restarts too.
    """

    def __init__(self, store: Store, outbox: Outbox, places: Places) -> None:
        self.store, self.outbox, self.places = store, outbox, places
        self._writing = threading.Lock()  # a row and its status file are written together, by one thread at a time
        self.observers: list[Callable[[Job], None]] = []  # told of every saved change (the ops surfaces); must not block

    def save(self, job: Job, expect: str | None = None) -> None:
        job.updated_at = jobid.iso(jobid.utc_now())
        with self._writing:
            self.store.save(job, expect)
            self._write_status(job)
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
        return bool(self.store.behind("status") or self.store.behind("log"))

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
            self.store.mark_behind(job.job_id, "status", False)

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

    def catch_up(self) -> None:
        """Write the files the outbox refused; stops at the first refusal (the next round goes on from there)."""
        try:
            for job_id in self.store.behind("status"):
                with self._writing:  # the mark is cleared under the lock: a newer refused write would set it again
                    job = self.store.get(job_id)
                    if job is not None:
                        self.outbox.write_status(job)
                    self.store.mark_behind(job_id, "status", False)
                log.info("status.caught_up", job_id=job_id)
            for job_id in self.store.behind("log"):
                job = self.store.get(job_id)
                if job is not None and job.state in TERMINAL:  # a retried job writes its log anew
                    self.outbox.move_log(self.places.local_log(job_id), job_id)
                self.store.mark_behind(job_id, "log", False)
                log.info("log.caught_up", job_id=job_id)
        except SaigeError:
            pass  # still refused: the next round tries again

    def requeue(self, job: Job, reason: str, error: SaigeError | None = None, spend_attempt: bool = True) -> None:
        """Back to the queue; the status file's `error` says why the last attempt did not finish."""
        job.error = error.as_dict(job.step) if error else None
        job.state, job.step, job.step_index = QUEUED, None, 0
        job.attempt += 1 if spend_attempt else 0
        event("job.requeued", job, "warning", reason=reason, error_code=error.code if error else None)
        self.save(job)  # the status file last, as for every transition

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

    def relocate(self, jobs: list[Job], dest: Path) -> None:
        """Move the jobs' claimed folder (they share one) to `dest` and point their rows at it."""
        claim = Path(jobs[0].claim_dir)
        if claim.exists() and claim != dest:
            ownfolders.ensure(dest.parent, self.places.inbox)
            claim.rename(dest)
        for job in jobs:
            job.entry["onnx"] = job.entry["onnx"].replace(str(claim), str(dest), 1)
            job.claim_dir = str(dest)
            self.store.save(job)

    def end(self, job: Job, state: str, error: SaigeError | None = None, expect: str | None = None,
            announce: bool = True) -> None:
        """A terminal state: the row; the log, the inputs and the journal event; and last the status file.

        So whoever reads the final status finds the log in the outbox, the inputs deleted or under failed/.
        """
        job.state, job.finished_at = state, jobid.iso(jobid.utc_now())
        job.error = error.as_dict(error.fields.get("step")) if error else None
        # the row first: `expect` is checked before anything moves, and a crash once the inputs are deleted
        # does not run the job again
        with self._writing:
            self.store.save(job, expect)
        self.move_log(job)
        try:
            self.settle_inputs(job)
        except OSError as exc:  # the inputs stay where they are; the job's end is still written
            log.error("inputs.settle_failed", job_id=job.job_id, job_name=job.name, error_code="INTERNAL",
                      message=f"{job.claim_dir}: {exc}")
        if announce:
            event(ENDED[state], job, "info" if state == SUCCEEDED else "warning",
                  message=error.message.splitlines()[0] if error else None)
        self.save(job)


class Worker(threading.Thread):
    """Takes the next queued job (priority, then FIFO) and runs it; one at a time."""

    def __init__(self, config: Config, jobs: Jobs, containers: Containers, places: Places,
                 on_change: Callable[[], None] = lambda: None) -> None:
        super().__init__(name="saigeedged-worker", daemon=True)
        self.config, self.jobs, self.containers, self.places = config, jobs, containers, places
        self.on_change = on_change  # the daemon's STATUS= line follows the running job
        containers.interrupted = lambda: self._reason
        self.wake = threading.Event()
        self.stop_event = threading.Event()
        self.current: Job | None = None
        self.outage = Outage()
        self._reason: str | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self.stop_event.is_set():
            if self.outage.due():
                self._ping_engine()
            job = self.jobs.store.next_queued(DOCKER_TARGETS if self.outage.active else ())
            if job is None:
                self.wake.wait(self.outage.wait_s(1.0))
                self.wake.clear()
                continue
            try:
                self.execute(job)
            except Exception as exc:  # a guard: a bug settling one job must not stop the queue
                log.error("job.internal_error", job_id=job.job_id, job_name=job.name, error_code="INTERNAL",
                          message=f"{type(exc).__name__}: {exc}")
                self._abandon(job, exc)
                self.stop_event.wait(1.0)  # if the job could not be settled either, do not spin on it

    def interrupt(self, reason: str) -> None:
        """Stop the running job: kill its step in the container; in-process steps stop at the next step.

        The kill is a Docker call that a hung engine may not answer for engine_timeout_s: it runs in a thread of
        its own so that the main loop (and its watchdog pings) never waits on it.
        """
        with self._lock:
            if self._reason == reason:
                return  # already asked (the main loop sees a cancel request until the job ends)
            job, self._reason = self.current, reason
        container = self.containers.active
        if job is not None and container is not None:
            threading.Thread(target=container.interrupt, args=(self.config.work_root / job.job_id, reason),
                             name="saigeedged-interrupt", daemon=True).start()

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()
        self.interrupt("stop")

    def _start(self, job: Job) -> bool:
        job.state, job.started_at, job.step, job.error, job.progress = RUNNING, jobid.iso(jobid.utc_now()), None, None, None
        try:
            self.jobs.save(job, expect=QUEUED)
        except TransitionError:
            return False  # cancelled by `saigeedged cancel` meanwhile
        with self._lock:
            self.current, self._reason = job, None
        event("job.started", job, attempt=job.attempt)
        self.on_change()
        return True

    def execute(self, job: Job) -> None:
        if not self._start(job):
            return
        work = self.config.work_root / job.job_id
        shutil.rmtree(work, ignore_errors=True)
        joblog = JobLog(self.places.local_log(job.job_id))
        joblog.line(f"### {job.job_id} attempt {job.attempt} on saigeedged")
        try:
            self._run(job, work, joblog)
            joblog.close()
            self.jobs.end(job, SUCCEEDED)
        except SaigeError as exc:
            joblog.line(f"### {exc.code}: {exc.message}")
            joblog.close()
            self._settle(job, exc)
        finally:
            self.containers.release()
            with self._lock:
                self.current = None
            self.on_change()
            if not self.config.keep_work and not self.outage.active:  # in an outage its pidfile is kept for reap()
                shutil.rmtree(work, ignore_errors=True)

    def _run(self, job: Job, work: Path, joblog: JobLog) -> None:
        entry = entry_from_doc(job.entry)
        rel = Path(job.subdir) / entry.output_name
        policy = PathPolicy((Path(job.claim_dir), self.places.inbox, *self.config.allowed_roots))

        def on_step(name: str, index: int, count: int) -> None:
            job.step, job.step_index, job.step_count = name, index, count  # progress names its own step
            self.jobs.save(job)
            event("job.step", job, index=index, count=count)
            self.on_change()

        def on_inputs(facts: dict[str, Any]) -> None:
            job.onnx_sha256 = facts.get("onnx_sha256", job.onnx_sha256)
            job.calib_samples = facts.get("calib_samples", job.calib_samples)
            job.cache = facts.get("cache", job.cache)

        def on_progress(progress: dict[str, Any]) -> None:
            job.progress = progress
            self.jobs.save(job)

        def refused(exc: SaigeError, wait_s: float) -> None:
            event("publish.retrying", job, "warning", error_code=exc.code, message=exc.message, retry_in_s=wait_s)

        limits = self.config.section("limits")

        def publish(bundle: Path) -> None:
            job.bundle = publish_patiently(lambda: self.jobs.outbox.publish_bundle(bundle, rel, job.job_id),
                                           limits["publish_patience_s"], lambda: self._reason, refused)

        run = pipeline.Job(job.job_id, entry, work, joblog, self.config, policy, on_step, on_progress, on_inputs,
                           container=self.containers.get, deadline=time.monotonic() + limits["job_timeout_s"],
                           interrupted=lambda: self._reason)
        result = pipeline.run(run, publish, job.created_at)
        job.onnx_sha256, job.calib_samples, job.report = result.onnx_sha256, result.calib_samples, result.report
        if result.report and result.report.get("flagged"):
            event("job.quantization_flagged", job, "warning", outputs=",".join(result.report["flagged"]))

    def _settle(self, job: Job, exc: SaigeError) -> None:
        """Requeue an interrupted or retryable job, else end it failed or cancelled."""
        max_attempts = int(self.config.section("limits")["max_attempts"])
        if exc.code == "CANCELLED" and exc.fields.get("reason") == "stop":  # the operator's, not the job's fault:
            self.jobs.requeue(job, "stop", spend_attempt=job.attempt < max_attempts)  # never past max_attempts
        elif exc.code == "CANCELLED":
            self.jobs.end(job, CANCELLED, exc)
        elif exc.code == "DOCKER_UNAVAILABLE":
            self._hold(job, exc)
        elif exc.retryable and job.attempt < max_attempts and not exc.fields.get("exhausted"):
            if exc.code == "CONTAINER_LOST":
                self._recreate(job)
            self.jobs.requeue(job, exc.code.lower(), exc)
        else:
            self.jobs.end(job, FAILED, exc)

    def _hold(self, job: Job, exc: SaigeError) -> None:
        """The engine is unreachable: not the job's fault, so it waits in the queue with its attempt unspent."""
        if self.outage.begin(job.target):
            log.warning("docker.unavailable", error_code=exc.code, message=exc.message, hint=exc.hint)
        self.jobs.requeue(job, "docker_unavailable", exc, spend_attempt=False)

    def _ping_engine(self) -> None:
        """End the outage once the engine answers and the steps it ran unseen are killed (never raises)."""
        try:
            if not self.containers.engine_up():
                raise SaigeError("DOCKER_UNAVAILABLE", "the engine does not answer")
            for target in sorted(self.outage.targets):
                self.containers.container(target).reap()
        except Exception as exc:  # a guard: whatever the engine does, the worker thread goes on
            if not isinstance(exc, SaigeError):
                log.warning("docker.ping_failed", message=f"{type(exc).__name__}: {exc}")
            self.outage.still_down()
            return
        log.info("docker.available", down_s=round(self.outage.end(), 1))
        self.on_change()

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

"""The single worker: runs queued jobs one at a time and settles each one (publish, requeue or fail)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from saigeedged import jobid
from saigeedged.adapters.container import Container, Containers
from saigeedged.adapters.events import event
from saigeedged.adapters.joblog import JobLog
from saigeedged.compile import ahead, pipeline
from saigeedged.compile.inputs import PathPolicy
from saigeedged.config import Config
from saigeedged.errors import SaigeError
from saigeedged.jobs import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Job, TransitionError, entry_from_doc
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.outage import DOCKER_TARGETS, Outage
from saigeedged.service.publishing import publish_patiently

if TYPE_CHECKING:
    from saigeedged.service.ahead import Preparer

log = structlog.get_logger()


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
        self.ahead: Preparer | None = None  # set by the daemon: host steps of queued jobs done while one compiles

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
        prepared = self.ahead.take(job, lambda: self._reason) if self.ahead else None
        if prepared is None:
            shutil.rmtree(work, ignore_errors=True)
        joblog = JobLog(self.places.local_log(job.job_id))
        joblog.line(f"### {job.job_id} attempt {job.attempt} on saigeedged")
        try:
            self._run(job, work, joblog, ahead.Ready(prepared, joblog) if prepared else None)
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

    def _run(self, job: Job, work: Path, joblog: JobLog, host: ahead.Ready | None = None) -> None:
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

        limits = self.config.limits

        def publish(bundle: Path) -> None:
            job.bundle = publish_patiently(lambda: self.jobs.outbox.publish_bundle(bundle, rel, job.job_id),
                                           limits.publish_patience_s, lambda: self._reason, refused)

        run = pipeline.Job(job.job_id, entry, work, joblog, self.config, policy, on_step, on_progress, on_inputs,
                           container=self.containers.get, deadline=time.monotonic() + limits.job_timeout_s,
                           interrupted=lambda: self._reason, host=host)
        result = pipeline.run(run, publish, job.created_at)
        job.onnx_sha256, job.calib_samples, job.report = result.onnx_sha256, result.calib_samples, result.report
        if result.report and result.report.get("flagged"):
            event("job.quantization_flagged", job, "warning", outputs=",".join(result.report["flagged"]))

    def _settle(self, job: Job, exc: SaigeError) -> None:
        """Requeue an interrupted or retryable job, else end it failed or cancelled."""
        max_attempts = self.config.limits.max_attempts
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

"""Start-up and rescan recovery: claimed folders without rows, leftover temp files, status files a lost database
left behind, and jobs the daemon died under (bounded by limits.max_attempts)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from saigeedged import files, jobid
from saigeedged.adapters.events import event
from saigeedged.compile import resume
from saigeedged.errors import SaigeError
from saigeedged.intake import claims, ownfolders
from saigeedged.intake.claims import Orphan
from saigeedged.jobs import FAILED, QUEUED, RUNNING, TERMINAL, Job, bundle_rel, spent
from saigeedged.records import AttemptRecord, UnreadableRecord
from saigeedged.service import legacy
from saigeedged.service.lifecycle import Jobs

log = structlog.get_logger()


@dataclass(frozen=True)
class Left:
    """An interrupted attempt as found at start: may it go on (re-attach), and how many daemons died under it."""

    resumable: bool
    crashes: int


class Recovery:
    """What the daemon settles at start and at each scan so that every drop ends in one visible state."""

    def __init__(self, jobs: Jobs, max_attempts: int,
                 legacy_record: Callable[[Job, Path], AttemptRecord] | None = None) -> None:
        self.jobs, self.max_attempts = jobs, max_attempts
        self.legacy_record = legacy_record  # rebuilds the record of an attempt of the release before records
        self.store, self.places, self.outbox = jobs.store, jobs.places, jobs.outbox
        self._reported: set[str] = set()  # folders whose rows could not be written, logged once
        self._claimed = claims.Seen()  # claimed folders already settled: a rescan does not read them again

    # -- claimed folders -------------------------------------------------------------------------
    def _settled(self, orphan: Orphan) -> bool:
        if orphan.jobs:
            return all(self.store.get(j.job_id) is not None for j in orphan.jobs)
        return bool(self.store.by_claim(str(orphan.folder)) or self.store.get(orphan.folder.name))

    def claims(self) -> bool:
        """Settle every claimed folder without rows; True when jobs were queued. Called at start and after each scan:
        a folder seen settled once (its rows written) is not read again, so a rescan costs no more with a long queue."""
        queued = False
        for orphan in claims.orphans(self.places.claimed, self._settled, self._claimed):
            try:
                queued |= self._settle(orphan)
            except sqlite3.OperationalError as exc:  # state_dir full or read-only: the next rescan tries again
                if orphan.folder.name not in self._reported:
                    log.error("claim.unqueued", claim=str(orphan.folder), error_code="INTERNAL",
                              message=f"cannot write the job rows: {exc}; tried again at each rescan")
                self._reported.add(orphan.folder.name)
            except OSError as exc:
                log.error("claim.unrecovered", claim=str(orphan.folder), error_code="INTERNAL", message=str(exc))
        return queued

    def _settle(self, orphan: Orphan) -> bool:
        if orphan.complete:
            try:
                return self._requeue(orphan)
            except sqlite3.OperationalError:
                raise
            except Exception as exc:  # a row no database takes (e.g. a priority beyond 64 bits)
                self._fail(orphan, f"its job row cannot be written: {type(exc).__name__}: {exc}")
                return False
        if orphan.record is not None:
            claims.undo(orphan.folder, orphan.record)
            log.warning("claim.undone", claim=str(orphan.folder), message="an unfinished claim went back to the inbox")
        elif not claims.contents(orphan.folder):
            shutil.rmtree(orphan.folder)
        else:
            self._fail(orphan, "no record of the claim (claimed by an older saigeedged, or the record was lost)")
        return False

    def _requeue(self, orphan: Orphan) -> bool:
        """The rows the claim did not write (a failed insert, a lost database), with their status file's attempt."""
        for job in orphan.jobs:
            if self.store.get(job.job_id) is not None:
                continue
            seen = self.outbox.read_status(job.job_id) or {}
            if seen.get("state") in (QUEUED, RUNNING):
                job.attempt = int(seen.get("attempt", 1)) + (1 if seen["state"] == RUNNING else 0)
            job.state, job.updated_at = QUEUED, jobid.iso(jobid.utc_now())
            self.jobs.add(job)
            event("claim.recovered", job, "warning", claim=str(orphan.folder), attempt=job.attempt)
        self._reported.discard(orphan.folder.name)
        return True

    def _fail(self, orphan: Orphan, reason: str) -> None:
        """A claimed folder that cannot become jobs: its files under failed/, a failed job with a status file."""
        dest = self.places.failed / orphan.folder.name
        ownfolders.move(orphan.folder, dest, self.places.inbox)
        error = SaigeError("INTERNAL", f"{orphan.folder.name}: found under claimed/ without a job: {reason}",
                           hint=f"its files are in {dest}: drop them again (fix the manifest if it names the cause)")
        now = jobid.iso(jobid.utc_now())
        for job in orphan.jobs or [Job(job_id=orphan.folder.name, name=orphan.folder.name.rsplit("-", 2)[0], target="?",
                                       task="?", entry={"onnx": str(dest / "?.onnx")}, subdir="", claim_dir=str(dest),
                                       manifest="?", created_at=now)]:
            job.state, job.priority, job.claim_dir, job.finished_at, job.updated_at = FAILED, 0, str(dest), now, now
            job.error = error.as_dict("validate")
            event("job.failed", job, "warning", message=error.message)
            try:
                self.jobs.add(job)
            except Exception:  # not even a failed row: the status file alone tells the outcome
                self.outbox.write_status(job)

    # -- interrupted jobs ------------------------------------------------------------------------
    def attempt_left(self, job: Job, work: Path) -> Left:
        """What the last daemon left of the running `job`'s attempt, counted now: a daemon that did not stop on
        purpose (no `detached` in the record) died under it. Not resumable when its record cannot be read, or when a
        step may run but its host steps' results cannot be replayed; then its record is made anew to reap by."""
        take = len(job.attempts)
        try:
            record = self.store.current_record(job)
        except UnreadableRecord as exc:
            log.warning("job.record_unreadable", job_id=job.job_id, message=str(exc))
            record = None
        else:
            if record is None and self.legacy_record is not None and legacy.started(work):
                record = self._legacy(job, work)
        if record is None or (record.started and not resume.usable(record.prepared)):
            engine = str(job.attempts[-1]["engine"]) if job.attempts else ""
            self.store.put_record(AttemptRecord(job.job_id, take, job.attempt, engine, job.target, str(work),
                                                started=True, crashes=1 if record is None else record.crashes + 1))
            return Left(False, 0)
        crashes = record.crashes + (0 if record.detached else 1)
        self.store.update_record(job.job_id, take, crashes=crashes, detached=False)
        return Left(crashes < self.max_attempts, crashes)

    def _legacy(self, job: Job, work: Path) -> AttemptRecord | None:
        """An attempt of the release before attempt records (an upgrade during its step): its record rebuilt from
        what can be checked (service/legacy.py), or None with the reason in the journal (it is requeued)."""
        assert self.legacy_record is not None
        try:
            record = self.legacy_record(job, work)
        except legacy.Unresumable as exc:
            log.warning("job.legacy_unresumable", job_id=job.job_id, work=str(work),
                        message=f"an attempt of the previous release cannot go on: {exc}; its step is killed and the "
                        "job runs again")
            return None
        self.store.put_record(record)
        legacy.forget(work)
        log.info("job.legacy_adopted", job_id=job.job_id, work=str(work), steps=",".join(record.steps),
                 message="the previous release's attempt checked and recorded: its step goes on")
        return record

    def interrupted(self, job: Job, max_attempts: int) -> None:
        """A job the daemon died under (killed, out of memory) runs again, up to max_attempts in all."""
        if spent(job) < max_attempts:  # the attempts a stop ended are not the job's
            self.jobs.requeue(job, "restart")
            return
        self.died_under(job, spent(job))

    def died_under(self, job: Job, times: int) -> None:
        """The daemon died under this job `times` times: it ends failed instead of running for ever."""
        error = SaigeError("INTERNAL", f"the daemon stopped during this job {times} times (last in step "
                           f"{job.step}): killed, or out of memory?", step=job.step,
                           hint="`journalctl -u saigeedged` and `dmesg` say why; raise limits.max_attempts or run "
                           "`saigeedged retry JOB_ID` once fixed")
        self.jobs.end(job, FAILED, error)

    # -- leftovers -------------------------------------------------------------------------------
    def unrecorded_bundles(self, job_ids: list[str]) -> None:
        """Jobs a crash cut while their bundles were published (Store.forget_publishing): a bundle of theirs already
        in the outbox, which no status file names, is removed. The re-attached attempt publishes its own (its report
        made again) under the same name, not beside it under another; a cancel or a failure leaves none."""
        for job_id in job_ids:
            job = self.store.get(job_id)
            if job is None or job.state != RUNNING:
                continue
            try:
                removed = self.outbox.unpublish(bundle_rel(job), job_id)
            except OSError as exc:  # left in the outbox: the attempt publishes beside it, under a name of its own
                log.warning("outbox.unpublish_failed", job_id=job_id, job_name=job.name, message=str(exc))
                continue
            for path in removed:
                log.warning("outbox.bundle_unrecorded", job_id=job_id, job_name=job.name, path=path.as_posix(),
                            message="a bundle published before the daemon died, its end unwritten: removed, the job "
                            "publishes it again")

    def temp_files(self) -> threading.Thread:
        """Temp files of outbox writes a kill interrupted (status files, logs, bundles) are removed (the daemon is the
        outbox's only writer, SPEC §11). A long history means hundreds of thousands of files to list, so the sweep
        runs beside the start-up, not before READY; it leaves this process's own temp files alone (files.WRITING,
        and `.<name>.<pid>.tmp` as releases before named them), since the daemon writes the outbox meanwhile."""
        mine = f".{os.getpid()}.tmp"

        def sweep() -> None:
            for folder, _, names in os.walk(self.outbox.root):
                for name in names:
                    if name[0] == "." and files.TEMP_NAME.match(name) and not name.endswith(mine) and \
                            files.remove_leftover(Path(folder) / name):
                        log.info("outbox.temp_removed", path=str(Path(folder) / name))

        thread = threading.Thread(target=sweep, name="saigeedged-sweep", daemon=True)
        thread.start()
        return thread

    def work_dirs(self, work_root: Path, reaping: set[str]) -> None:
        """Work folders of our jobs that have ended (a kill left them behind) are removed at start, but for those
        whose step is still to be killed (`reaping`: its pidfile is there); folders of other processes (a
        `saigeedged compile` beside us) have no row and are left alone."""
        for folder in sorted(work_root.iterdir()) if work_root.is_dir() else []:
            job = None if folder.name in reaping else self.store.get(folder.name)
            if folder.is_dir() and job is not None and job.state in TERMINAL:
                shutil.rmtree(folder, ignore_errors=True)

    def lost_statuses(self) -> None:
        """After the database was rebuilt: a status file still queued or running whose job has no row (its inputs
        were not under claimed/) is ended, so its readers (`submit --wait`) do not wait forever."""
        folder = self.outbox.root / "status"
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            doc = self.outbox.read_status(path.stem)
            if not doc or doc.get("state") in TERMINAL or self.store.get(path.stem) is not None:
                continue
            job = Job(job_id=path.stem, name=str(doc.get("name")), target=str(doc.get("target")),
                      task=str(doc.get("task")), entry={"onnx": str((doc.get("inputs") or {}).get("onnx"))},
                      subdir="", claim_dir="", manifest=str((doc.get("inputs") or {}).get("manifest")),
                      state=FAILED, attempt=int(doc.get("attempt") or 1), created_at=str(doc.get("created_at")),
                      finished_at=jobid.iso(jobid.utc_now()))
            job.error = SaigeError("INTERNAL", "the job database was lost and this job's inputs were not under "
                                   "claimed/", hint="drop the model again").as_dict(doc.get("step"))
            self.jobs.add(job)
            event("job.failed", job, "warning", message="lost with the job database")

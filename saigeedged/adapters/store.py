"""The durable queue: job rows in SQLite (WAL) under state_dir, taken and written under the attempt's fence (SPEC §15),
and the engines' last known state. The only module that writes the database (its file: adapters/database.py)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from saigeedged.adapters import attempts
from saigeedged.adapters.attempts import AttemptRecords
from saigeedged.adapters.database import (
    FENCE,
    FINAL,
    FINISHED,
    SCHEMA_VERSION,
    TARGET,
    CorruptDatabase,
    NewerDatabase,
    StoreFull,
    connect,
    fence_args,
    patient,
    private,
    transient,
)
from saigeedged.adapters.history import History
from saigeedged.engines import TARGETS
from saigeedged.jobid import iso, utc_now
from saigeedged.jobs import (
    QUEUED,
    RUNNING,
    TERMINAL,
    Attempt,
    CancelWins,
    Job,
    Superseded,
    TransitionError,
    begin_attempt,
    check_transition,
)
from saigeedged.records import AttemptRecord

__all__ = ["ENDING", "FINAL", "SCHEMA_VERSION", "CorruptDatabase", "EngineState", "NewerDatabase", "Store", "StoreFull"]

ENDING = "ending"  # a `behind` kind: an ended row whose status file is not written yet (Store.save, Jobs._end)
# the `cancel` column of a running row: a cancel is asked for (the daemon ends the job cancelled), or the bundle's
# rename into the outbox has begun (Store.begin_publishing: a cancel comes too late); any new state clears it
CANCEL_ASKED, PUBLISHING = 1, 2


@dataclass(frozen=True)
class EngineState:
    """An engine as the daemon last saw it: up or down (and why), since when, the targets of its slots."""

    name: str
    up: bool
    reason: str | None
    since: str
    slots: tuple[str, ...]


class Store(History, AttemptRecords):
    """Job rows keyed by job_id; every state change is checked against the transition table."""

    def __init__(self, path: Path, verify: bool = True) -> None:
        """`verify`: quick_check the file if its last close was not clean (the daemon); a short-lived command that
        opens it beside a running daemon (which leaves a -wal) passes False rather than read the whole file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.created = not path.exists()  # a first start, or a database deleted: the caller rebuilds what it can
        private(path)
        self._db = connect(path, verify)
        self._lock = threading.RLock()  # one connection shared by the main loop and the worker thread
        # set by the daemon: asked (and waits) when a write finds state_dir full; True: try the write again
        self.wait_for_room: Callable[[StoreFull], bool] | None = None

    def close(self) -> None:
        self._db.close()

    def restore_if_deleted(self) -> bool:
        """The database file deleted under us: write the open one back to its path and use that.

        The open connection still holds every row, so nothing is lost; True when it had to be restored.
        """
        if self.path.exists():
            return False
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.restore")
            tmp.unlink(missing_ok=True)
            copy = sqlite3.connect(str(tmp))
            self._db.backup(copy)
            copy.close()
            self._db.close()  # its WAL (if still there) goes with it
            for stale in (self.path.with_name(self.path.name + "-wal"), self.path.with_name(self.path.name + "-shm")):
                stale.unlink(missing_ok=True)
            tmp.replace(self.path)
            private(self.path)
            self._db = connect(self.path, verify=False)  # just written whole from a healthy connection
        return True

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; a full or failing disk raises StoreFull with nothing written (try again later)."""
        with self._lock:
            try:
                if self._db.in_transaction:  # a ROLLBACK that failed last time (the disk was failing)
                    self._db.execute("ROLLBACK")
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:  # a failed COMMIT (SQLITE_FULL) has already rolled back
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                full = transient(exc)
                if full is None:
                    raise
                raise full from exc

    def _rows(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def _jobs(self, sql: str, args: tuple[object, ...] = ()) -> list[Job]:
        return [Job.from_doc(json.loads(str(r[0]))) for r in self._rows(sql, args)]

    @patient
    def add(self, job: Job) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO jobs (job_id, name, state, priority, created_at, claim_dir, doc, engine) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (job.job_id, job.name, job.state, job.priority, job.created_at,
                                                           job.claim_dir, json.dumps(job.to_doc()), job.engine))

    def get(self, job_id: str) -> Job | None:
        jobs = self._jobs("SELECT doc FROM jobs WHERE job_id = ?", (job_id,))
        return jobs[0] if jobs else None

    @patient
    def save(self, job: Job, expect: str | None = None, fence: Attempt | None = None) -> None:
        """Write `job`; when its state changes, the stored state must be `expect` (or any allowed predecessor).

        `fence`: a write of that attempt, made only while the row still names it and is `expect` (default running),
        else Superseded. A running row flagged by `saigeedged cancel` never goes back to the queue: CancelWins.
        """
        with self._tx() as db:
            row = db.execute("SELECT state, cancel FROM jobs WHERE job_id = ?", (job.job_id,)).fetchone()
            if row is None:
                raise KeyError(job.job_id)
            stored, flagged = str(row[0]), row[1] == CANCEL_ASKED
            if fence is not None and stored != (expect or RUNNING):
                raise Superseded(f"job {job.job_id} is {stored}: attempt {fence.attempt} on {fence.engine} is over")
            if expect is not None and stored != expect:
                raise TransitionError(f"job {job.job_id} is {stored}, expected {expect}")
            if stored != job.state:
                check_transition(stored, job.state)
                job.pruned_at = None  # a new run (`retry`) or its end: the files written from now on are its own
            if stored == RUNNING and job.state == QUEUED and flagged:
                raise CancelWins(f"job {job.job_id} was cancelled while running: it is not requeued")
            cancel = 0 if job.state != stored else None  # a new state clears a pending cancel request
            where, args = ("job_id = ?", (job.job_id,)) if fence is None else \
                (f"job_id = ? AND {FENCE}", (job.job_id, *fence_args(fence)))
            changed = db.execute(f"UPDATE jobs SET state = ?, priority = ?, claim_dir = ?, doc = ?, "
                                 f"cancel = COALESCE(?, cancel), engine = ? WHERE {where}",
                                 (job.state, job.priority, job.claim_dir, json.dumps(job.to_doc()), cancel, job.engine,
                                  *args)).rowcount
            if not changed:
                raise Superseded(f"job {job.job_id} is on another attempt than {fence}")
            if job.state in TERMINAL and stored != job.state:  # its status file is still to write (Jobs._end): a
                # daemon killed before it has the next start write it (Jobs.ended_unwritten); no mark if the fence fails
                db.execute("INSERT OR IGNORE INTO behind (job_id, kind) VALUES (?, ?)", (job.job_id, ENDING))
            if job.state in TERMINAL:  # nothing resumes an ended job: its records keep only what a reap needs
                db.execute("UPDATE attempts SET doc = json_remove(doc, '$.prepared', '$.steps') WHERE job_id = ? "
                           "AND (json_type(doc, '$.prepared') IS NOT NULL OR json_type(doc, '$.steps') IS NOT NULL)",
                           (job.job_id,))

    @patient
    def take(self, job_id: str, engine: str, now_iso: str, work: str = "") -> Job | None:
        """Move a queued job to running on `engine`, its new attempt opened; None if it is no longer queued (another
        slot took it, it was cancelled). One conditional write: of the slots that saw the job, one runs it; the attempt's
        record (`work`: its work dir) is written with it."""
        with self._tx() as db:
            row = db.execute("SELECT doc FROM jobs WHERE job_id = ? AND state = ? AND cancel = 0",
                             (job_id, QUEUED)).fetchone()
            if row is None:
                return None
            job = Job.from_doc(json.loads(str(row[0])))
            takes = len(job.attempts)
            job.state, job.started_at, job.updated_at, job.step, job.error, job.progress, job.finishing = \
                RUNNING, now_iso, now_iso, None, None, None, False
            begin_attempt(job, engine, now_iso)
            taken = db.execute("UPDATE jobs SET state = ?, doc = ?, engine = ? WHERE job_id = ? AND state = ? "
                               "AND cancel = 0 AND COALESCE(json_array_length(doc, '$.attempts'), 0) = ? RETURNING doc",
                               (RUNNING, json.dumps(job.to_doc()), job.engine, job_id, QUEUED, takes)).fetchone()
            if taken is not None:  # its record, in the same transaction: no attempt runs without one
                attempts.write(db, AttemptRecord(job_id, takes + 1, job.attempt, engine, job.target, work))
        return None if taken is None else Job.from_doc(json.loads(str(taken[0])))

    @patient
    def mark_finishing(self, fence: Attempt, handed: bool) -> None:
        """Record that the running attempt `fence` is (or is no longer) the finishing stage's (Job.finishing): that
        field alone, so a finisher's own write of the job never races it. Superseded when the store names another
        attempt."""
        with self._tx() as db:
            if not db.execute(f"UPDATE jobs SET doc = json_set(doc, '$.finishing', json(?)) WHERE job_id = ? AND "
                              f"state = ? AND {FENCE}", ("true" if handed else "false", fence.job_id, RUNNING,
                                                        *fence_args(fence))).rowcount:
                raise Superseded(f"job {fence.job_id}: attempt {fence.attempt} on {fence.engine} is over")

    def still_current(self, fence: Attempt) -> bool:
        """Does the row still name this attempt, running?"""
        return bool(self._rows(f"SELECT 1 FROM jobs WHERE job_id = ? AND state = ? AND {FENCE}",
                               (fence.job_id, RUNNING, *fence_args(fence))))

    def next_queued(self, skip_targets: tuple[str, ...] = ()) -> Job | None:
        """The job to run next: highest priority, then first in (jobs for `skip_targets` wait).

        With targets to skip, the head of each other target's queue (jobs_queued_target), the best of them: a slot
        that serves no host job must not read past every queued host job of a burst at each look."""
        if not skip_targets:
            jobs = self._jobs("SELECT doc FROM jobs WHERE state = ? ORDER BY priority DESC, seq LIMIT 1", (QUEUED,))
            return jobs[0] if jobs else None
        heads = [row for target in TARGETS if target not in skip_targets for row in self._rows(
            "SELECT priority, seq, doc FROM jobs INDEXED BY jobs_queued_target WHERE state = 'queued' AND "
            f"{TARGET} = ? ORDER BY priority DESC, seq LIMIT 1", (target,))]
        if not heads:
            return None
        best = min(heads, key=lambda row: (-int(str(row[0])), int(str(row[1]))))
        return Job.from_doc(json.loads(str(best[2])))

    def in_state(self, *states: str) -> list[Job]:
        marks = ",".join("?" * len(states))
        return self._jobs(f"SELECT doc FROM jobs WHERE state IN ({marks}) ORDER BY priority DESC, seq", states)

    def count(self, state: str) -> int:
        return int(str(self._rows("SELECT COUNT(*) FROM jobs WHERE state = ?", (state,))[0][0]))

    def head(self, state: str, limit: int) -> list[Job]:
        """The first `limit` jobs in `state`, in queue order (a page or a scrape need not decode a long queue)."""
        return self._jobs("SELECT doc FROM jobs WHERE state = ? ORDER BY priority DESC, seq LIMIT ?", (state, limit))

    def count_by_target(self, state: str) -> dict[str, int]:
        """Jobs in `state` per target; the queue's from jobs_queued_target alone (no doc read: a scrape, a textfile
        and each page ask, with a burst of thousands queued)."""
        if state == QUEUED:
            rows = self._rows(f"SELECT {TARGET}, COUNT(*) FROM jobs INDEXED BY jobs_queued_target WHERE state = 'queued' "
                              "GROUP BY 1")
        else:
            rows = self._rows(f"SELECT {TARGET}, COUNT(*) FROM jobs WHERE state = ? GROUP BY 1", (state,))
        return {str(target): int(str(n)) for target, n in rows}

    def waiting_by_target(self) -> dict[str, int]:
        """Queued and running jobs per target: what the targets' images are needed for."""
        queued, running = self.count_by_target(QUEUED), self.count_by_target(RUNNING)
        return {t: queued.get(t, 0) + running.get(t, 0) for t in {*queued, *running}}

    def recent(self, limit: int = 20) -> list[Job]:
        """The newest `limit` final jobs, newest first (read backwards along jobs_final: no sort of the history)."""
        return self._jobs(f"SELECT doc FROM jobs INDEXED BY jobs_final WHERE {FINAL} ORDER BY seq DESC LIMIT ?", (limit,))

    def find(self, key: str) -> Job | None:
        """A job by id, else the newest job with that name."""
        job = self.get(key)
        if job is not None:
            return job
        jobs = self._jobs("SELECT doc FROM jobs WHERE name = ? ORDER BY seq DESC LIMIT 1", (key,))  # jobs_name
        return jobs[0] if jobs else None

    def newest_named(self, name: str, states: tuple[str, ...]) -> Job | None:
        """The newest job with that name in one of `states` (along jobs_name)."""
        marks = ", ".join("?" * len(states))
        jobs = self._jobs(f"SELECT doc FROM jobs WHERE name = ? AND state IN ({marks}) ORDER BY seq DESC LIMIT 1",
                          (name, *states))
        return jobs[0] if jobs else None

    def by_claim(self, claim_dir: str) -> list[Job]:
        """Every job whose inputs live in this claimed folder (the entries of one multi-model drop)."""
        return self._jobs("SELECT doc FROM jobs WHERE claim_dir = ? ORDER BY seq", (claim_dir,))

    def mark_pruned(self, job_id: str, finished_at: str | None, now_iso: str) -> bool:
        """Record that retention removes the job's files (the first prune's time stays), in one write that lands only
        while the row is still the final job that ended at `finished_at` (a `retry` meanwhile makes a new run, whose
        files are its own); False if not."""
        with self._tx() as db:
            return bool(db.execute("UPDATE jobs SET doc = json_set(doc, '$.pruned_at', COALESCE(json_extract(doc, "
                                   f"'$.pruned_at'), ?)) WHERE job_id = ? AND {FINAL} AND {FINISHED} IS ?",
                                   (now_iso, job_id, finished_at)).rowcount)

    def request_cancel(self, job_id: str) -> bool:
        """Flag a running job for the daemon to cancel (a column of its own: the worker rewrites the doc); False when
        it is not running (any more), or its bundle is being published (too late: Store.begin_publishing). Only a running
        row carries the flag, so a queued one is always takeable."""
        with self._tx() as db:
            return bool(db.execute("UPDATE jobs SET cancel = ? WHERE job_id = ? AND state = ? AND cancel != ?",
                                   (CANCEL_ASKED, job_id, RUNNING, PUBLISHING)).rowcount)

    def cancel_requested(self, job_id: str) -> bool:
        rows = self._rows("SELECT cancel FROM jobs WHERE job_id = ?", (job_id,))
        return bool(rows and rows[0][0] == CANCEL_ASKED)

    def publishing(self, job_id: str) -> bool:
        """Is the bundle of this running job being published (Store.begin_publishing): too late for a cancel?"""
        rows = self._rows("SELECT cancel FROM jobs WHERE job_id = ? AND state = ?", (job_id, RUNNING))
        return bool(rows and rows[0][0] == PUBLISHING)

    @patient
    def begin_publishing(self, fence: Attempt) -> None:
        """Mark the publication of the running attempt `fence` begun (the bundle's rename follows): a cancel asked for
        from here on is refused as too late. CancelWins when a cancel came first (the job ends cancelled, its bundle
        never published), Superseded when the store names another attempt."""
        with self._tx() as db:
            row = db.execute(f"SELECT cancel FROM jobs WHERE job_id = ? AND state = ? AND {FENCE}",
                             (fence.job_id, RUNNING, *fence_args(fence))).fetchone()
            if row is None:
                raise Superseded(f"job {fence.job_id}: attempt {fence.attempt} on {fence.engine} is over")
            if row[0] == CANCEL_ASKED:
                raise CancelWins(f"job {fence.job_id} was cancelled before its bundle was published")
            db.execute("UPDATE jobs SET cancel = ? WHERE job_id = ?", (PUBLISHING, fence.job_id))

    @patient
    def forget_publishing(self) -> list[str]:
        """At start (one daemon per state_dir: no publication is under way): every publishing mark a crash left between
        begin_publishing and the job's end is cleared, so a cancel of the re-attached job is heard again (it said "too
        late" for good). The jobs cleared: their bundles may be in the outbox, unrecorded (Outbox.unpublish)."""
        with self._tx() as db:
            return sorted(str(row[0]) for row in db.execute("UPDATE jobs SET cancel = 0 WHERE cancel = ? RETURNING job_id",
                                                           (PUBLISHING,)).fetchall())

    @patient
    def unpublishing(self, fence: Attempt) -> None:
        """The rename did not happen (the outbox refused it): a cancel may win again while the job waits."""
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET cancel = 0 WHERE job_id = ? AND state = ? AND cancel = ? AND {FENCE}",
                       (fence.job_id, RUNNING, PUBLISHING, *fence_args(fence)))

    @patient
    def mark_behind(self, job_id: str, kind: str, behind: bool = True) -> None:
        """Remember (durably, with the row) that the outbox has not taken this job's `kind` file ("status", "log")."""
        with self._tx() as db:
            if behind:
                db.execute("INSERT OR IGNORE INTO behind (job_id, kind) VALUES (?, ?)", (job_id, kind))
            else:
                db.execute("DELETE FROM behind WHERE job_id = ? AND kind = ?", (job_id, kind))

    def status_written(self, job_id: str) -> None:
        """The job's status file says what its row does: no mark of one still to write (refused, or an end's)."""
        with self._tx() as db:
            db.execute("DELETE FROM behind WHERE job_id = ? AND kind IN ('status', ?)", (job_id, ENDING))

    def behind(self, kind: str) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT job_id FROM behind WHERE kind = ? ORDER BY job_id", (kind,))]

    def set_engine(self, name: str, up: bool, reason: str | None, slots: list[str], now_iso: str | None = None) -> None:
        """Record an engine's state; `since` moves only when it goes up or down (or is first seen)."""
        now = now_iso or iso(utc_now())
        with self._tx() as db:
            db.execute("INSERT INTO engines (name, up, reason, since, slots) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT (name) DO UPDATE SET since = CASE WHEN up = excluded.up THEN since ELSE excluded.since END, "
                       "up = excluded.up, reason = excluded.reason, slots = excluded.slots",
                       (name, int(up), None if up else reason, now, json.dumps(list(slots))))

    def engines(self) -> list[EngineState]:
        """Every engine recorded, in the order they were first recorded (the config's, at the daemon's first start)."""
        rows = self._rows("SELECT name, up, reason, since, slots FROM engines ORDER BY rowid")
        return [EngineState(str(name), bool(up), None if reason is None else str(reason), str(since),
                            tuple(json.loads(str(slots)))) for name, up, reason, since, slots in rows]

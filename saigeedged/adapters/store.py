"""The durable queue: one SQLite table (WAL) under state_dir. The only module that touches the database."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saigeedged.jobid import iso, utc_now
from saigeedged.jobs import (
    QUEUED,
    RUNNING,
    Attempt,
    CancelWins,
    Job,
    Superseded,
    TransitionError,
    begin_attempt,
    check_transition,
)
from saigeedged.manifest import TARGETS

# Final rows, spelled as in the partial indexes below (a query uses one only when its WHERE names the same terms).
# Queries over the history name their index (INDEXED BY): without statistics the planner would take jobs_queue for
# the state and sort every final row, and an index that cannot serve the query is then an error, not a slow scan.
FINAL = "state IN ('cancelled', 'failed', 'succeeded')"
FINISHED = "json_extract(doc, '$.finished_at')"
TARGET = "json_extract(doc, '$.target')"
PAGE = 500  # rows decoded at a time by a caller that walks many (`paged`)
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT UNIQUE NOT NULL,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    cancel INTEGER NOT NULL DEFAULT 0,
    claim_dir TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs (state, priority DESC, seq);
CREATE INDEX IF NOT EXISTS jobs_claim ON jobs (claim_dir);
CREATE INDEX IF NOT EXISTS jobs_name ON jobs (name, seq);
CREATE INDEX IF NOT EXISTS jobs_final ON jobs (seq) WHERE state IN ('cancelled', 'failed', 'succeeded');
CREATE INDEX IF NOT EXISTS jobs_final_name ON jobs (name) WHERE state IN ('cancelled', 'failed', 'succeeded');
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (json_extract(doc, '$.finished_at'))
    WHERE state IN ('cancelled', 'failed', 'succeeded');
CREATE INDEX IF NOT EXISTS jobs_bundle ON jobs (json_extract(doc, '$.bundle.path'))
    WHERE json_extract(doc, '$.bundle.path') IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_queued_target ON jobs (json_extract(doc, '$.target'), priority DESC, seq)
    WHERE state = 'queued';
CREATE TABLE IF NOT EXISTS behind (job_id TEXT NOT NULL, kind TEXT NOT NULL, PRIMARY KEY (job_id, kind));
CREATE TABLE IF NOT EXISTS tallies (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS engines (
    name TEXT PRIMARY KEY,
    up INTEGER NOT NULL,
    reason TEXT,
    since TEXT NOT NULL,
    slots TEXT NOT NULL
);
"""
# columns added after the first release: (table, column, declaration, backfill from the row's doc or None)
MIGRATIONS = (("jobs", "engine", "TEXT", "json_extract(doc, '$.engine')"),)
# PRAGMA user_version: 0 = no version yet (a release before versioning: read as 1); 2 = this one (SPEC §15).
# STEPS[n] takes a database of version n - 1 to n; each step is idempotent (a crash mid-way runs it again).
SCHEMA_VERSION = 2
# the row still names this attempt (jobs.Attempt): its number, how many times the job was taken, its engine
FENCE = ("json_extract(doc, '$.attempt') = ? AND json_array_length(doc, '$.attempts') = ? "
         "AND json_extract(doc, '$.attempts[#-1].engine') = ?")


def _fence_args(fence: Attempt) -> tuple[object, ...]:
    return (fence.attempt, fence.take, fence.engine)


@dataclass(frozen=True)
class EngineState:
    """An engine as the daemon last saw it: up or down (and why), since when, the targets of its slots."""

    name: str
    up: bool
    reason: str | None
    since: str
    slots: tuple[str, ...]


class CorruptDatabase(Exception):
    """The job database cannot be read: the daemon must not start on it (nor replace it)."""


class StoreFull(sqlite3.OperationalError):
    """The database could not be written (or opened): state_dir is full or failing (SQLITE_FULL, SQLITE_IOERR,
    SQLITE_CANTOPEN). Nothing was written and nothing is damaged: the same write succeeds once space returns.

    An OperationalError, as SQLite raised it before: the callers that already treat one as "the next round tries
    again" (recovery of claims) keep doing so; the type says which OperationalErrors are worth the wait.
    """


CORRUPT = frozenset({"SQLITE_CORRUPT", "SQLITE_NOTADB"})  # the only answers that say the file itself is bad
TRANSIENT = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN")  # prefixes: SQLITE_IOERR_WRITE, _SHMSIZE, ...


def _errorname(exc: sqlite3.Error) -> str:
    """The primary SQLite error name (SQLITE_CORRUPT_VTAB is SQLITE_CORRUPT); "" when SQLite gave none."""
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    return next((known for known in (*CORRUPT, *TRANSIENT) if name.startswith(known)), name)


def transient(exc: BaseException) -> StoreFull | None:
    """`exc` (or what it was raised from, e.g. a ROLLBACK after a failed COMMIT) as StoreFull, if a full or failing
    disk caused it."""
    while exc is not None:
        if isinstance(exc, sqlite3.Error) and _errorname(exc) in TRANSIENT:
            return StoreFull(f"cannot write the job database: {exc} ({_errorname(exc)}); state_dir full or failing?")
        exc = exc.__context__  # type: ignore[assignment]
    return None


def _wants_check(path: Path) -> bool:
    """quick_check reads the whole database (O(size), issue 21): run it only when the last close was not clean, the
    one case where a damaged file is to be expected. SQLite removes the -wal file at the last clean close, so a -wal
    left over means a crash, a kill or a power loss (or another process has it open: `status` beside a daemon)."""
    return path.with_name(path.name + "-wal").exists()


def _connect(path: Path, verify: bool = True) -> sqlite3.Connection:
    check = verify and _wants_check(path)
    db = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        _migrate(db, path)
        answer = db.execute("PRAGMA quick_check").fetchone() if check else ("ok",)
        if answer is None or answer[0] != "ok":
            raise CorruptDatabase(str(answer[0] if answer else "no answer to quick_check"))
    except NewerDatabase:
        db.close()
        raise
    except (sqlite3.Error, CorruptDatabase) as exc:
        db.close()
        full = transient(exc)
        if full is not None:
            raise StoreFull(f"cannot open the job database {path}: {exc} ({_errorname(exc)}); free space in "  # type: ignore[arg-type]
                            f"{path.parent} and start again: nothing is lost") from None
        if isinstance(exc, sqlite3.Error) and _errorname(exc) not in CORRUPT:
            raise
        raise CorruptDatabase(f"job database {path} is corrupt ({exc}); move it aside (mv {path} {path}.corrupt) "
                              "and start again: the queue is rebuilt from claimed/ and the status files") from None
    return db


def _add_columns(db: sqlite3.Connection) -> None:
    """Add the columns an older database lacks, filled from each row's doc (idempotent)."""
    for table, column, declaration, backfill in MIGRATIONS:
        if column not in {str(row[1]) for row in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            if backfill:
                db.execute(f"UPDATE {table} SET {column} = {backfill}")


STEPS: dict[int, Callable[[sqlite3.Connection], None]] = {2: _add_columns}


class NewerDatabase(Exception):
    """The job database was written by a newer saigeedged (a higher schema version): this one must not touch it."""


def _version(db: sqlite3.Connection) -> int:
    """The database's schema version; 0 for a new, empty file."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version == 0 and db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone():
        return 1  # written before versioning
    return version


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the database to SCHEMA_VERSION: an older one is first copied to `<name>.bak-<version>`; a newer one is
    refused (NewerDatabase). Under BEGIN IMMEDIATE, so a `status` opening it at the same time waits, then finds it done.

    SCHEMA runs at every open (CREATE ... IF NOT EXISTS: a no-op, no write, when all is there), so a new index needs
    no version of its own.
    """
    found = _version(db)
    if found > SCHEMA_VERSION:
        raise NewerDatabase(f"job database {path} is schema version {found}, this saigeedged knows up to "
                            f"{SCHEMA_VERSION}: run the newer saigeedged (or restore {path.name}.bak-{SCHEMA_VERSION})")
    if found == SCHEMA_VERSION:
        db.executescript(SCHEMA)
        return
    if found:
        _backup(db, path.with_name(f"{path.name}.bak-{found}"))
    db.execute("BEGIN IMMEDIATE")
    try:
        found = _version(db)  # another process may have migrated it meanwhile
        for statement in filter(str.strip, SCHEMA.split(";")):  # not executescript: it would commit half-way
            db.execute(statement)  # a new file gets version 1's tables here, and the steps from there
        for version in range(max(found, 1) + 1, SCHEMA_VERSION + 1):
            STEPS[version](db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _backup(db: sqlite3.Connection, dest: Path) -> None:
    """A consistent copy of the open database (WAL included) at `dest`, private like the database, whole or absent."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.close(os.open(tmp, os.O_CREAT | os.O_WRONLY, 0o600))
    copy = sqlite3.connect(str(tmp))
    try:
        db.backup(copy)
    finally:
        copy.close()
    tmp.replace(dest)


def _private(path: Path) -> None:
    """The database (it holds manifests' passwords) readable by the service user only; SQLite gives its -wal and
    -shm files the database's mode."""
    os.close(os.open(path, os.O_CREAT | os.O_RDONLY, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if file.exists() and file.stat().st_uid == os.geteuid():  # an operator's `status` leaves the modes alone
            os.chmod(file, 0o600)


class Store:
    """Job rows keyed by job_id; every state change is checked against the transition table."""

    def __init__(self, path: Path, verify: bool = True) -> None:
        """`verify`: quick_check the file if its last close was not clean (the daemon); a short-lived command that
        opens it beside a running daemon (which leaves a -wal) passes False rather than read the whole file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.created = not path.exists()  # a first start, or a database deleted: the caller rebuilds what it can
        _private(path)
        self._db = _connect(path, verify)
        self._lock = threading.RLock()  # one connection shared by the main loop and the worker thread

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
            _private(self.path)
            self._db = _connect(self.path, verify=False)  # just written whole from a healthy connection
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

    def add(self, job: Job) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO jobs (job_id, name, state, priority, created_at, claim_dir, doc, engine) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (job.job_id, job.name, job.state, job.priority, job.created_at,
                                                           job.claim_dir, json.dumps(job.to_doc()), job.engine))

    def get(self, job_id: str) -> Job | None:
        jobs = self._jobs("SELECT doc FROM jobs WHERE job_id = ?", (job_id,))
        return jobs[0] if jobs else None

    def save(self, job: Job, expect: str | None = None, fence: Attempt | None = None) -> None:
        """Write `job`; when its state changes, the stored state must be `expect` (or any allowed predecessor).

        `fence`: a write of that attempt, made only while the row still names it and is `expect` (default running),
        else Superseded. A running row flagged by `saigeedged cancel` never goes back to the queue: CancelWins.
        """
        with self._tx() as db:
            row = db.execute("SELECT state, cancel FROM jobs WHERE job_id = ?", (job.job_id,)).fetchone()
            if row is None:
                raise KeyError(job.job_id)
            stored, flagged = str(row[0]), bool(row[1])
            if fence is not None and stored != (expect or RUNNING):
                raise Superseded(f"job {job.job_id} is {stored}: attempt {fence.attempt} on {fence.engine} is over")
            if expect is not None and stored != expect:
                raise TransitionError(f"job {job.job_id} is {stored}, expected {expect}")
            if stored != job.state:
                check_transition(stored, job.state)
            if stored == RUNNING and job.state == QUEUED and flagged:
                raise CancelWins(f"job {job.job_id} was cancelled while running: it is not requeued")
            cancel = 0 if job.state != stored else None  # a new state clears a pending cancel request
            where, args = ("job_id = ?", (job.job_id,)) if fence is None else \
                (f"job_id = ? AND {FENCE}", (job.job_id, *_fence_args(fence)))
            changed = db.execute(f"UPDATE jobs SET state = ?, priority = ?, claim_dir = ?, doc = ?, "
                                 f"cancel = COALESCE(?, cancel), engine = ? WHERE {where}",
                                 (job.state, job.priority, job.claim_dir, json.dumps(job.to_doc()), cancel, job.engine,
                                  *args)).rowcount
            if not changed:
                raise Superseded(f"job {job.job_id} is on another attempt than {fence}")

    def take(self, job_id: str, engine: str, now_iso: str) -> Job | None:
        """Move a queued job to running on `engine`, its new attempt opened; None if it is no longer queued (another
        slot took it, it was cancelled). One conditional write: of the slots that saw the job, one runs it."""
        with self._tx() as db:
            row = db.execute("SELECT doc FROM jobs WHERE job_id = ? AND state = ? AND cancel = 0",
                             (job_id, QUEUED)).fetchone()
            if row is None:
                return None
            job = Job.from_doc(json.loads(str(row[0])))
            takes = len(job.attempts)
            job.state, job.started_at, job.updated_at, job.step, job.error, job.progress = \
                RUNNING, now_iso, now_iso, None, None, None
            begin_attempt(job, engine, now_iso)
            taken = db.execute("UPDATE jobs SET state = ?, doc = ?, engine = ? WHERE job_id = ? AND state = ? "
                               "AND cancel = 0 AND COALESCE(json_array_length(doc, '$.attempts'), 0) = ? RETURNING doc",
                               (RUNNING, json.dumps(job.to_doc()), job.engine, job_id, QUEUED, takes)).fetchone()
        return None if taken is None else Job.from_doc(json.loads(str(taken[0])))

    def still_current(self, fence: Attempt) -> bool:
        """Does the row still name this attempt, running?"""
        return bool(self._rows(f"SELECT 1 FROM jobs WHERE job_id = ? AND state = ? AND {FENCE}",
                               (fence.job_id, RUNNING, *_fence_args(fence))))

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

    def by_claim(self, claim_dir: str) -> list[Job]:
        """Every job whose inputs live in this claimed folder (the entries of one multi-model drop)."""
        return self._jobs("SELECT doc FROM jobs WHERE claim_dir = ? ORDER BY seq", (claim_dir,))

    def request_cancel(self, job_id: str) -> bool:
        """Flag a running job for the daemon to cancel (a column of its own: the worker rewrites the doc); False when
        it is not running (any more): only a running row carries the flag, so a queued one is always takeable."""
        with self._tx() as db:
            return bool(db.execute("UPDATE jobs SET cancel = 1 WHERE job_id = ? AND state = ?", (job_id, RUNNING)).rowcount)

    def cancel_requested(self, job_id: str) -> bool:
        rows = self._rows("SELECT cancel FROM jobs WHERE job_id = ?", (job_id,))
        return bool(rows and rows[0][0])

    def forget(self, ends: list[tuple[str, str | None]]) -> int:
        """Delete the rows of final jobs (retention's `keep_rows_days`), each only if it still ended at that time (a
        `retry` meanwhile makes it a new job); returns how many went."""
        deleted = 0
        with self._tx() as db:
            for job_id, finished_at in ends:
                cur = db.execute(f"DELETE FROM jobs WHERE job_id = ? AND {FINAL} AND {FINISHED} IS ?", (job_id, finished_at))
                if cur.rowcount:
                    deleted += cur.rowcount
                    db.execute("DELETE FROM behind WHERE job_id = ?", (job_id,))
        return deleted

    def mark_behind(self, job_id: str, kind: str, behind: bool = True) -> None:
        """Remember (durably, with the row) that the outbox has not taken this job's `kind` file ("status", "log")."""
        with self._tx() as db:
            if behind:
                db.execute("INSERT OR IGNORE INTO behind (job_id, kind) VALUES (?, ?)", (job_id, kind))
            else:
                db.execute("DELETE FROM behind WHERE job_id = ? AND kind = ?", (job_id, kind))

    def behind(self, kind: str) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT job_id FROM behind WHERE kind = ? ORDER BY job_id", (kind,))]

    def end_keys_since(self, stamp: str) -> list[tuple[str, str | None, int]]:
        """(job_id, finished_at, seq) of the final jobs whose `finished_at` is `stamp` or later (UTC ISO strings sort by
        time; "" = every final job), by seq, without their docs: a caller that has seen most of them decodes only the
        others (`paged`)."""
        if not stamp:
            rows = self._rows(f"SELECT job_id, {FINISHED}, seq FROM jobs WHERE {FINAL} ORDER BY seq")
        else:
            rows = self._rows(f"SELECT job_id, {FINISHED}, seq FROM jobs INDEXED BY jobs_finished WHERE {FINAL} AND "
                              f"{FINISHED} >= ? ORDER BY seq", (stamp,))
        return [(str(i), None if f is None else str(f), int(str(n))) for i, f, n in rows]

    def newest_end(self) -> str:
        """The latest `finished_at` of a final job ("" when none): one step along jobs_finished."""
        rows = self._rows(f"SELECT MAX({FINISHED}) FROM jobs INDEXED BY jobs_finished WHERE {FINAL}")
        return str(rows[0][0] or "")

    def ended_before(self, stamp: str) -> list[int]:
        """The seqs of final jobs that ended before `stamp` (or never said when), oldest first; read from the index
        alone, so a caller decodes only the pages it takes (`by_seqs`)."""
        rows = self._rows(f"SELECT seq FROM jobs INDEXED BY jobs_finished WHERE {FINAL} AND "
                          f"({FINISHED} < ? OR {FINISHED} IS NULL) ORDER BY {FINISHED}, seq", (stamp,))
        return [int(str(r[0])) for r in rows]

    def by_seqs(self, seqs: list[int]) -> list[Job]:
        marks = ",".join("?" * len(seqs))
        return self._jobs(f"SELECT doc FROM jobs WHERE seq IN ({marks}) ORDER BY seq", tuple(seqs)) if seqs else []

    def paged(self, seqs: list[int]) -> Iterator[Job]:
        """The jobs of `seqs`, decoded PAGE at a time (a long history is never whole in memory)."""
        for start in range(0, len(seqs), PAGE):
            yield from self.by_seqs(seqs[start:start + PAGE])

    def crowded_names(self, keep: int) -> list[str]:
        """Names with more than `keep` final jobs (from jobs_final_name alone)."""
        rows = self._rows(f"SELECT name FROM jobs INDEXED BY jobs_final_name WHERE {FINAL} GROUP BY name HAVING COUNT(*) > ? "
                          "ORDER BY name", (keep,))
        return [str(r[0]) for r in rows]

    def final_named(self, name: str) -> list[Job]:
        """Every final job of `name` (jobs_name)."""
        return self._jobs(f"SELECT doc FROM jobs WHERE name = ? AND {FINAL} ORDER BY seq", (name,))

    def with_bundle(self, path: str) -> list[Job]:
        """The jobs whose bundle is at `path` (relative to the outbox; several builds may share one, jobs_bundle)."""
        return self._jobs("SELECT doc FROM jobs WHERE json_extract(doc, '$.bundle.path') = ? ORDER BY seq", (path,))

    @staticmethod
    def _ended_in(after: str) -> str:
        """Final rows that ended in [after, before) (the `?`s); from the first end ("" after), rows that never said
        when they ended count too."""
        if after:
            return f"{FINAL} AND {FINISHED} >= ? AND {FINISHED} < ?"
        return f"{FINAL} AND ? = '' AND ({FINISHED} < ? OR {FINISHED} IS NULL)"

    def ended_groups(self, after: str, before: str,
                     bounds: tuple[float, ...]) -> list[tuple[str, str, str, int, int | None, int, float, str]]:
        """The final jobs that ended in [after, before), summed by SQLite along jobs_finished (no doc is decoded in
        Python): per (target, state, error code, cache hit, run-time bucket or None when it never ran), the jobs, the
        sum of their run times and the latest end."""
        ran = f"json_extract(doc, '$.started_at') <> '' AND json_extract(doc, '$.step') <> '' AND {FINISHED} <> ''"
        seconds = f"MAX(0.0, (julianday({FINISHED}) - julianday(json_extract(doc, '$.started_at'))) * 86400.0)"
        cases = " ".join(f"WHEN d <= {b!r} THEN {i}" for i, b in enumerate(bounds[:-1]))
        rows = self._rows(
            f"SELECT target, state, code, hit, CASE WHEN d IS NULL THEN NULL {cases} ELSE {len(bounds) - 1} END, "
            "COUNT(*), COALESCE(SUM(d), 0.0), COALESCE(MAX(finished), '') FROM (SELECT json_extract(doc, '$.target') AS "
            "target, state, COALESCE(json_extract(doc, '$.error.code'), '') AS code, CASE WHEN "
            f"json_extract(doc, '$.cache.hit') THEN 1 ELSE 0 END AS hit, CASE WHEN {ran} THEN {seconds} END AS d, "
            f"{FINISHED} AS finished FROM jobs INDEXED BY jobs_finished WHERE {self._ended_in(after)}) "
            "GROUP BY 1, 2, 3, 4, 5", (after, before))
        return [(str(t), str(st), str(c), int(str(h)), None if b is None else int(str(b)), int(str(n)), float(str(d)),
                 str(f)) for t, st, c, h, b, n, d, f in rows]

    def ended_attempts(self, after: str, before: str) -> list[tuple[str, str, int]]:
        """(engine, error code or "", attempts) over the attempts of the jobs that ended in [after, before)."""
        rows = self._rows(
            "SELECT json_extract(a.value, '$.engine'), COALESCE(json_extract(a.value, '$.error'), ''), COUNT(*) "
            f"FROM jobs INDEXED BY jobs_finished, json_each(jobs.doc, '$.attempts') AS a WHERE {self._ended_in(after)} "
            "GROUP BY 1, 2", (after, before))
        return [(str(e), str(c), int(str(n))) for e, c, n in rows]

    def last_measured(self, after: str, before: str) -> list[tuple[str, str, str, dict[str, Any]]]:
        """Per (target, task), the accuracy report of the job that ended last in [after, before) with one: (target,
        task, its end, the report). One pass along jobs_finished; SQLite takes a bare column from the MAX() row."""
        rows = self._rows(
            f"SELECT {TARGET}, json_extract(doc, '$.task'), MAX({FINISHED}), "
            f"json_extract(doc, '$.accuracy') FROM jobs INDEXED BY jobs_finished WHERE {self._ended_in(after)} "
            "AND json_type(doc, '$.accuracy') = 'object' GROUP BY 1, 2", (after, before))
        return [(str(t), str(k), str(f or ""), json.loads(str(a))) for t, k, f, a in rows]

    def tally(self, name: str) -> dict[str, Any] | None:
        """A summary kept beside the rows (the metrics' counts up to some end), or None."""
        rows = self._rows("SELECT doc FROM tallies WHERE name = ?", (name,))
        doc = json.loads(str(rows[0][0])) if rows else None
        return doc if isinstance(doc, dict) else None

    def set_tally(self, name: str, doc: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO tallies (name, doc) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET doc = excluded.doc",
                       (name, json.dumps(doc)))

    def running_on(self, engine: str) -> list[Job]:
        """The running jobs whose current attempt is on `engine`."""
        return self._jobs("SELECT doc FROM jobs WHERE state = ? AND engine = ? ORDER BY seq", (RUNNING, engine))

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

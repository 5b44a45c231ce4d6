"""The job database's file: its schema and migrations (PRAGMA user_version, SPEC §15), opening it, and what a
full, failing or corrupt state_dir looks like to SQLite. Only the store (adapters/store.py) opens it."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from saigeedged.jobs import Attempt

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound="Patient")

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
# version 3: the attempt records (SPEC §15), which the attempts' folders held before
ATTEMPTS = """
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL,
    take INTEGER NOT NULL,
    engine TEXT NOT NULL,
    reap INTEGER NOT NULL DEFAULT 0,
    doc TEXT NOT NULL,
    PRIMARY KEY (job_id, take)
);
CREATE INDEX IF NOT EXISTS attempts_reap ON attempts (engine) WHERE reap = 1;
"""
SCHEMA += ATTEMPTS
# columns added after the first release: (table, column, declaration, backfill from the row's doc or None)
MIGRATIONS = (("jobs", "engine", "TEXT", "json_extract(doc, '$.engine')"),)
# PRAGMA user_version: 0 = no version yet (a release before versioning: read as 1); 2 = the release before attempt
# records (it would run on beside them, blind to them: it must refuse this database); 3 = this one (SPEC §15).
# STEPS[n] takes a database of version n - 1 to n; each step is idempotent (a crash mid-way runs it again).
SCHEMA_VERSION = 3
# the row still names this attempt (jobs.Attempt): its number, how many times the job was taken, its engine
FENCE = ("json_extract(doc, '$.attempt') = ? AND json_array_length(doc, '$.attempts') = ? "
         "AND json_extract(doc, '$.attempts[#-1].engine') = ?")


def fence_args(fence: Attempt) -> tuple[object, ...]:
    return (fence.attempt, fence.take, fence.engine)


class CorruptDatabase(Exception):
    """The job database cannot be read: the daemon must not start on it (nor replace it)."""


class StoreFull(sqlite3.OperationalError):
    """The database could not be written (or opened): state_dir is full or failing (SQLITE_FULL, SQLITE_IOERR,
    SQLITE_CANTOPEN). Nothing was written and nothing is damaged: the same write succeeds once space returns.

    An OperationalError, as SQLite raised it before: the callers that already treat one as "the next round tries
    again" (recovery of claims) keep doing so; the type says which OperationalErrors are worth the wait.
    """


class Patient(Protocol):
    """A store whose writes may wait for room (Store.wait_for_room)."""

    wait_for_room: Callable[[StoreFull], bool] | None


def patient(write: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """A write that, on a full state_dir, asks `wait_for_room` (which waits) whether to try again: a worker's write
    waits for space instead of failing its job (issue 26); with no such callback, or when it says no, StoreFull."""

    def again(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        while True:
            try:
                return write(self, *args, **kwargs)
            except StoreFull as exc:
                if self.wait_for_room is None or not self.wait_for_room(exc):
                    raise

    functools.update_wrapper(again, write)
    return again


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


def connect(path: Path, verify: bool = True) -> sqlite3.Connection:
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


def _attempt_records(db: sqlite3.Connection) -> None:
    """The attempts table (idempotent; a new file has it from SCHEMA already)."""
    for statement in filter(str.strip, ATTEMPTS.split(";")):
        db.execute(statement)


STEPS: dict[int, Callable[[sqlite3.Connection], None]] = {2: _add_columns, 3: _attempt_records}


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


def private(path: Path) -> None:
    """The database (it holds manifests' passwords) readable by the service user only; SQLite gives its -wal and
    -shm files the database's mode.

    A missing file is made with that mode; an existing one is never opened here: closing any descriptor of it drops
    every lock this process holds on it (POSIX), those of a connection already open in it (a script calling
    saigeedged.cli.client twice) included, and a daemon closing beside it then removes the WAL under that connection,
    whose writes are lost (SQLite's "How To Corrupt", 2.2)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if file.exists() and file.stat().st_uid == os.geteuid():  # an operator's `status` leaves the modes alone
            os.chmod(file, 0o600)

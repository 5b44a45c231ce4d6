"""The job database's schema version (SPEC §15): older ones backed up then migrated, newer ones refused."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_config

from saigeedged.adapters.store import SCHEMA_VERSION, NewerDatabase, Store
from saigeedged.jobs import QUEUED, Job


def old_database(path: Path) -> None:
    """A database as the releases before versioning wrote it: user_version 0, no engine column, no engines table."""
    doc = Job(job_id="old-1", name="old", target="cubie", task="mlc", entry={"onnx": "/x.onnx"}, subdir="",
              claim_dir="/c/old-1", manifest="x.yml", created_at="t").to_doc()
    for key in ("engine", "attempts"):
        del doc[key]
    db = sqlite3.connect(path)
    db.executescript("""CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT UNIQUE NOT NULL,
        name TEXT NOT NULL, state TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL,
        cancel INTEGER NOT NULL DEFAULT 0, claim_dir TEXT NOT NULL, doc TEXT NOT NULL);""")
    db.execute("INSERT INTO jobs (job_id, name, state, created_at, claim_dir, doc) VALUES (?, ?, ?, ?, ?, ?)",
               (doc["job_id"], doc["name"], QUEUED, doc["created_at"], doc["claim_dir"], json.dumps(doc)))
    db.commit()
    db.close()


def version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def test_an_old_database_is_backed_up_then_migrated(tmp_path: Path) -> None:
    """A pre-versioning database: copied whole to saigeedged.db.bak-1 (mode 0600, still the old shape), then
    migrated to the current version; its queued job is taken as any other."""
    path = tmp_path / "saigeedged.db"
    old_database(path)
    store = Store(path)
    assert version(path) == SCHEMA_VERSION == 3
    backup = tmp_path / "saigeedged.db.bak-1"
    assert backup.stat().st_mode & 0o777 == 0o600
    copy = sqlite3.connect(backup)
    assert [r[1] for r in copy.execute("PRAGMA table_info(jobs)")].count("engine") == 0
    assert copy.execute("SELECT job_id FROM jobs").fetchall() == [("old-1",)] and version(backup) == 0
    copy.close()
    taken = store.take("old-1", "local", "t")
    assert taken is not None and taken.engine == "local" and len(taken.attempts) == 1
    store.close()
    Store(path).close()  # reopening the migrated database neither migrates nor backs up again
    assert sorted(p.name for p in tmp_path.iterdir() if ".bak-" in p.name) == ["saigeedged.db.bak-1"]


def test_a_new_database_starts_at_the_current_version_without_a_backup(tmp_path: Path) -> None:
    """A first start: the current version, nothing to back up."""
    Store(tmp_path / "saigeedged.db").close()
    assert version(tmp_path / "saigeedged.db") == SCHEMA_VERSION
    assert [p.name for p in tmp_path.iterdir() if ".bak-" in p.name] == []


def newer_database(path: Path) -> None:
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()


def test_a_newer_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    """A database of a newer saigeedged: NewerDatabase naming the file and both versions; the file is not changed."""
    path = tmp_path / "saigeedged.db"
    newer_database(path)
    with pytest.raises(NewerDatabase, match=f"{path}.*version {SCHEMA_VERSION + 1}.*up to {SCHEMA_VERSION}"):
        Store(path)
    assert version(path) == SCHEMA_VERSION + 1


def test_run_on_a_newer_database_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """An older daemon started on a newer database: exit 2 (systemd does not restart it) with one line naming it."""
    config = write_config(tmp_path)
    path = tmp_path / "state" / "saigeedged.db"
    path.parent.mkdir()
    newer_database(path)
    run = subprocess.run([sys.executable, "-m", "saigeedged", "run", "-c", str(config)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert str(path) in run.stderr and str(SCHEMA_VERSION + 1) in run.stderr

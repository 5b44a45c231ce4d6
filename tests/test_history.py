"""A long history costs what is due, not its length (issue 21): indexed queries, metrics restored in SQL, bounded scans."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path

import yaml
from factory import yolox
from prometheus_client import generate_latest
from watchdog.events import DirCreatedEvent, FileCreatedEvent, FileMovedEvent

from saigeedged import jobid
from saigeedged.adapters.metrics import Metrics
from saigeedged.adapters.store import FINAL, Store
from saigeedged.compile.inputs import sha256_file
from saigeedged.intake import claims
from saigeedged.intake.inbox import Drop, Scanner
from saigeedged.intake.watch import _Wake
from saigeedged.jobs import CANCELLED, FAILED, SUCCEEDED, TERMINAL, Job


def ended(key: str, state: str, target: str, when: jobid.datetime, **fields: object) -> Job:
    job = Job(job_id=jobid.new(key, when), name=key, target=target, task="mlc", entry={"onnx": "/x.onnx"}, subdir="",
              claim_dir=f"/claimed/{key}", manifest=f"{key}.yml", state=state, created_at=jobid.iso(when))
    job.finished_at = jobid.iso(when)
    for name, value in fields.items():
        setattr(job, name, value)
    return job


def history(store: Store, when: jobid.datetime) -> None:
    """Jobs of every kind that counts differently: a cache hit, an error, a cancel while queued, a retried attempt."""
    ran = {"started_at": jobid.iso(when - timedelta(seconds=42)), "step": "publish"}
    store.add(ended("a", SUCCEEDED, "host", when, cache={"hit": True, "key": "k", "source_job_id": "x"},
                    attempts=[{"engine": "host", "error": None}], **ran))
    store.add(ended("b", SUCCEEDED, "cubie", when - timedelta(seconds=1), bundle={"path": "b.saigeedge"},
                    attempts=[{"engine": "local", "error": "CONTAINER_LOST"}, {"engine": "local", "error": None}],
                    started_at=jobid.iso(when - timedelta(seconds=700)), step="publish"))
    store.add(ended("c", FAILED, "mobilint", when, error={"code": "CALIB_INVALID", "message": "m"},
                    attempts=[{"engine": "local", "error": "CALIB_INVALID"}], **ran))
    store.add(ended("d", CANCELLED, "host", when, error={"code": "CANCELLED", "message": "m"}))
    store.add(ended("e", FAILED, "?", when, error={"code": "MANIFEST_INVALID", "message": "m"}))


def samples(store: Store) -> list[str]:
    metrics = Metrics(store, lambda: {"local": True})
    lines = generate_latest(metrics.registry).decode().splitlines()
    return sorted(line for line in lines if not line.startswith("#") and "_created" not in line
                  and "last_success" not in line)


def test_counters_restored_in_sql_equal_those_counted_job_by_job(tmp_path: Path) -> None:
    """Ends long before the start (summed by SQLite) give the same counters as ends just now (decoded one by one)."""
    old, new = Store(tmp_path / "old.db"), Store(tmp_path / "new.db")
    history(old, jobid.utc_now() - timedelta(days=3))
    history(new, jobid.utc_now())
    restored = samples(old)
    assert restored == samples(new)
    assert 'saigeedged_jobs_total{error_code="MANIFEST_INVALID",state="failed",target="unknown"} 1.0' in restored
    assert 'saigeedged_engine_attempts_total{engine="local",error_code="CONTAINER_LOST"} 1.0' in restored
    assert 'saigeedged_job_duration_seconds_bucket{le="1200.0",target="cubie"} 1.0' in restored
    assert "saigeedged_cache_hits_total 1.0" in restored


def test_history_queries_read_their_indexes(tmp_path: Path) -> None:
    """recent, a name, ends since/before a time, a bundle path and crowded names each use an index, not a scan."""
    store = Store(tmp_path / "q.db")
    history(store, jobid.utc_now())
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)  # the SQL as run, values bound
    store.recent(20)
    store.find("a")
    store.end_keys_since("2026-01-01T00:00:00")
    store.ended_before("2026-01-01T00:00:00")
    store.newest_end()
    store.with_bundle("b.saigeedge")
    store.crowded_names(1)
    store._db.set_trace_callback(None)
    plans = {}
    for sql in statements:
        if sql.startswith("SELECT"):
            plans[sql] = " ".join(str(row[-1]) for row in store._db.execute(f"EXPLAIN QUERY PLAN {sql}"))
    used = {index: [sql for sql, plan in plans.items() if re.search(rf"\b{index}\b", plan)] for index in
            ("jobs_final", "jobs_name", "jobs_finished", "jobs_bundle", "jobs_final_name")}
    assert all(used.values()), plans
    assert not [plan for plan in plans.values() if "SCAN jobs" in plan and "INDEX" not in plan], plans


def test_the_final_states_in_sql_are_the_terminal_states() -> None:
    """The partial indexes' WHERE names exactly the final states of the transition table."""
    assert FINAL == "state IN (" + ", ".join(f"'{s}'" for s in sorted(TERMINAL)) + ")"


def test_a_burst_is_claimed_a_batch_per_scan(tmp_path: Path) -> None:
    """Manifests beyond the parse budget wait for the next scan, which is due at once; none is lost or repeated."""
    model = yolox(tmp_path / "src.onnx")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for i in range(5):
        (inbox / f"m{i}.onnx").write_bytes(model.read_bytes())
        (inbox / f"m{i}.yml").write_text(yaml.safe_dump({"task": "mlc", "num_classes": 3, "calib": "/v.json",
                                                         "sha256": sha256_file(model)}))
    s = Scanner(inbox, 3600.0, 600.0, {}, parse_budget=2)
    first = s.scan(10.0)
    assert [d.manifest.name for d in first] == ["m0.yml", "m1.yml"] and s.next_due == 10.0
    assert all(isinstance(d, Drop) and d.files == [d.manifest, d.manifest.with_suffix(".onnx")] for d in first)
    s.forget([f for d in first for f in d.files])
    for d in first:
        for f in d.files:
            f.unlink()
    second, third = s.scan(10.0), s.scan(10.0)
    assert [d.manifest.name for d in second] == ["m2.yml", "m3.yml"]
    assert [d.manifest.name for d in third] == ["m2.yml", "m3.yml", "m4.yml"]  # parsed ones stay ready until claimed


def test_the_daemons_own_folder_never_wakes_the_scanner(tmp_path: Path) -> None:
    """Events inside `.saigeedged/` (its claims) do not wake the loop; a drop anywhere else in the inbox does."""
    wake = threading.Event()
    own = tmp_path / ".saigeedged"
    handler = _Wake(wake, str(own))
    handler.dispatch(DirCreatedEvent(str(own / "claimed" / "x-1")))
    handler.dispatch(FileMovedEvent(str(tmp_path / "x.yml"), str(own / "claimed" / "x-1" / "x.yml")))
    handler.dispatch(FileCreatedEvent(str(own / "claimed" / "x-1" / ".saigeedged-claim.json")))
    assert not wake.is_set()
    handler.dispatch(FileCreatedEvent(str(tmp_path / ".saigeedged-notours" / "y.yml")))
    assert wake.is_set()
    wake.clear()
    handler.dispatch(FileMovedEvent(str(tmp_path / ".y.yml.part"), str(tmp_path / "team" / "y.yml")))
    assert wake.is_set()


def test_old_databases_get_the_indexes_on_open(tmp_path: Path) -> None:
    """A database made before the indexes existed has them after the next open, its rows untouched."""
    path = tmp_path / "old.db"
    Store(path).close()
    db = sqlite3.connect(path)
    for index in ("jobs_name", "jobs_final", "jobs_final_name", "jobs_finished", "jobs_bundle"):
        db.execute(f"DROP INDEX {index}")
    db.commit()
    db.close()
    store = Store(path)
    history(store, jobid.utc_now())
    names = {str(r[0]) for r in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"jobs_name", "jobs_final", "jobs_final_name", "jobs_finished", "jobs_bundle"} <= names
    assert store.find("a") is not None and len(store.recent(10)) == 5


def test_a_restart_reads_the_kept_summary_not_the_rows(tmp_path: Path) -> None:
    """The counts of old ends are kept in the database: a later start gives them even after their rows were deleted."""
    store = Store(tmp_path / "s.db")
    history(store, jobid.utc_now() - timedelta(days=3))
    store.add(ended("z", SUCCEEDED, "host", jobid.utc_now()))  # the newest end: the old ones are well before it
    first = samples(store)
    gone = store.forget([(job_id, end) for job_id, end, _ in store.end_keys_since("") if not job_id.startswith("z-")])
    assert gone == 5 and [j.name for j in store.recent(10)] == ["z"]
    assert samples(store) == first


def test_a_rescan_reads_only_claimed_folders_not_seen_settled(tmp_path: Path) -> None:
    """Folders seen settled are not read again; one without rows is looked at each time; a new folder is read once."""
    claimed = tmp_path / "claimed"
    for name in ("a-1", "b-1", "c-1"):
        (claimed / name).mkdir(parents=True)
    looked: list[str] = []

    def settled(orphan: claims.Orphan) -> bool:
        looked.append(orphan.folder.name)
        return orphan.folder.name != "c-1"  # c-1 has no rows

    seen = claims.Seen()
    assert [o.folder.name for o in claims.orphans(claimed, settled, seen)] == ["c-1"]
    old = time.time() - 60
    os.utime(claimed, (old, old))  # claimed/ unchanged since, long enough ago
    looked.clear()
    assert [o.folder.name for o in claims.orphans(claimed, settled, seen)] == ["c-1"] and looked == ["c-1"]
    (claimed / "d-1").mkdir()  # a new claim: claimed/ changed
    looked.clear()
    assert [o.folder.name for o in claims.orphans(claimed, settled, seen)] == ["c-1"]
    assert sorted(looked) == ["c-1", "d-1"]

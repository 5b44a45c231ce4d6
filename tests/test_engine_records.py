"""Engine records (SPEC §11): each attempt's engine in the job row and status file, engine states in SQLite,
old databases migrated on open, and `saigeedged status` listing engines with the job in each slot."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import yaml
from conftest import write_config

from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import Store
from saigeedged.cli import main as cli
from saigeedged.jobs import FAILED, QUEUED, RUNNING, Attempt, Job, attempt_outcome, begin_attempt, end_attempt

T0, T1, T2, T3 = (f"2026-11-30T03:1{i}:00.000Z" for i in range(4))


def job(job_id: str, target: str = "cubie", **fields: Any) -> Job:
    return Job(job_id=job_id, name=job_id.split("-")[0], target=target, task="detection", entry={"onnx": "/x/det.onnx"},
               subdir="", claim_dir=f"/c/{job_id}", manifest="x.yml", created_at=T0, **fields)


def test_attempts_record_each_engine_and_how_it_ended() -> None:
    """begin_attempt opens an attempt on an engine and names it the job's engine; end_attempt closes only the open one."""
    j = job("det-1")
    begin_attempt(j, "compile2", T0)
    end_attempt(j, T1, "ENGINE_LOST")
    j.attempt = 2  # as its requeue spent one
    begin_attempt(j, "local", T2)
    assert j.engine == "local"
    end_attempt(j, T3, None)
    end_attempt(j, "later", "INTERNAL")  # nothing open: the record stays as it ended
    assert j.attempts == [{"engine": "compile2", "attempt": 1, "started_at": T0, "finished_at": T1, "error": "ENGINE_LOST"},
                          {"engine": "local", "attempt": 2, "started_at": T2, "finished_at": T3, "error": None}]


def test_an_attempt_the_daemon_died_under_is_closed_by_the_next() -> None:
    """An attempt never ended (the daemon killed mid-job) is closed as INTERNAL when the job starts again."""
    j = job("det-1")
    begin_attempt(j, "compile2", T0)
    begin_attempt(j, "compile2", T2)
    assert [(a["finished_at"], a["error"]) for a in j.attempts] == [(T2, "INTERNAL"), (None, None)]


def test_host_jobs_record_attempts_but_no_engine() -> None:
    """A host job's attempts are on engine `host`; the job's own engine stays null."""
    j = job("cls-1", target="host")
    begin_attempt(j, "host", T0)
    assert j.engine is None and j.attempts[0]["engine"] == "host"


def test_engine_and_attempts_survive_the_store_and_reach_the_status_file(tmp_path: Path) -> None:
    """The engine and attempts are stored with the row and written into the status file as `engine`, `attempts`."""
    store = Store(tmp_path / "q.db")
    j = job("det-1")
    store.add(j)
    j.state = RUNNING
    begin_attempt(j, "compile2", T0)
    store.save(j)
    store.close()
    again = Store(tmp_path / "q.db")
    loaded = again.get("det-1")
    assert loaded is not None and loaded.engine == "compile2" and loaded.attempts == j.attempts
    assert running_on(tmp_path / "q.db", "compile2") == ["det-1"] and running_on(tmp_path / "q.db", "local") == []
    outbox = Outbox(tmp_path / "out")
    outbox.write_status(loaded)
    doc = json.loads((tmp_path / "out" / "status" / "det-1.json").read_text())
    assert doc["engine"] == "compile2" and doc["attempts"] == [{"engine": "compile2", "attempt": 1, "started_at": T0,
                                                                 "finished_at": None, "error": None}]


def running_on(path: Path, engine: str) -> list[str]:
    """The running jobs whose current attempt is on `engine`, by the row's engine column."""
    with sqlite3.connect(path) as db:
        return [str(r[0]) for r in db.execute("SELECT job_id FROM jobs WHERE state = 'running' AND engine = ?", (engine,))]


def old_database(path: Path, doc: dict[str, Any]) -> None:
    """A database as the release before the pool wrote it: no engine column, no engines table."""
    db = sqlite3.connect(path)
    db.executescript("""CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT UNIQUE NOT NULL,
        name TEXT NOT NULL, state TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL,
        cancel INTEGER NOT NULL DEFAULT 0, claim_dir TEXT NOT NULL, doc TEXT NOT NULL);""")
    db.execute("INSERT INTO jobs (job_id, name, state, created_at, claim_dir, doc) VALUES (?, ?, ?, ?, ?, ?)",
               (doc["job_id"], doc["name"], doc["state"], doc["created_at"], doc["claim_dir"], json.dumps(doc)))
    db.commit()
    db.close()


def test_an_old_database_is_migrated_on_open(tmp_path: Path) -> None:
    """A database without the engine column opens: the column is added, old jobs read with no engine and no attempts."""
    doc = job("old-1", state=RUNNING).to_doc()
    for key in ("engine", "attempts"):
        del doc[key]
    old_database(tmp_path / "q.db", doc)
    store = Store(tmp_path / "q.db")
    loaded = store.get("old-1")
    assert loaded is not None and loaded.engine is None and loaded.attempts == []
    begin_attempt(loaded, "local", T1)
    store.save(loaded)
    assert running_on(tmp_path / "q.db", "local") == ["old-1"]
    store.close()
    assert Store(tmp_path / "q.db").engines() == []  # reopening a migrated database changes nothing


def test_engine_states_keep_since_until_up_or_down_changes(tmp_path: Path) -> None:
    """set_engine records up/down with a reason; `since` moves only when the engine goes up or down."""
    store = Store(tmp_path / "q.db")
    store.set_engine("local", True, None, ["cubie", "mobilint"], now_iso=T0)
    store.set_engine("compile2", False, "connection refused", ["cubie"], now_iso=T0)
    store.set_engine("local", True, "ignored while up", ["cubie"], now_iso=T1)
    store.set_engine("compile2", True, None, ["cubie"], now_iso=T2)
    states = {e.name: e for e in store.engines()}
    assert (states["local"].up, states["local"].reason, states["local"].since, states["local"].slots) == \
        (True, None, T0, ("cubie",))
    assert (states["compile2"].up, states["compile2"].since) == (True, T2)
    store.set_engine("compile2", False, "timed out", ["cubie"], now_iso=T3)
    assert [(e.name, e.up, e.reason, e.since) for e in store.engines()] == \
        [("local", True, None, T0), ("compile2", False, "timed out", T3)]


def status_setup(tmp_path: Path) -> Path:
    """Two engines configured and recorded, one job running on compile2, one queued."""
    path = write_config(tmp_path, engines=[{"name": "local", "url": "unix:///var/run/docker.sock"},
                                           {"name": "compile2", "url": "unix:///run/compile2.sock", "targets": ["cubie"]},
                                           {"name": "compile3", "url": "unix:///run/compile3.sock", "targets": ["cubie"]}])
    data = yaml.safe_load(path.read_text())
    store = Store(Path(data["state_dir"]) / "saigeedged.db")
    store.set_engine("local", True, None, ["cubie", "mobilint"])
    store.set_engine("compile2", False, "timed out", ["cubie"])
    running = job("det-1", state=RUNNING, step="quantize", step_index=5, step_count=11)
    begin_attempt(running, "compile2", T0)
    store.add(running)
    store.add(job("cls-2", state=QUEUED))
    store.close()
    return path


def test_status_lists_engines_and_the_job_in_each_slot(tmp_path: Path, capsys: Any) -> None:
    """`saigeedged status` with engines configured: each engine up/down (+reason), each slot's job or idle; an
    engine not recorded yet is listed as such."""
    assert cli.main(["status", "-c", str(status_setup(tmp_path))]) == 0
    out = capsys.readouterr().out
    engines = out[out.index("ENGINE"):].splitlines()
    assert engines[1].split() == ["local", "up", "cubie:", "idle;", "mobilint:", "idle"]
    assert engines[2].split()[:2] == ["compile2", "down"] and "cubie: det quantize 5/11  (timed out, since" in engines[2]
    assert engines[3].split()[:2] == ["compile3", "?"] and "not seen by the daemon yet" in engines[3]
    assert "det-1" in out and "cls-2" in out  # the job table is still there
    assert engines[4].split() == ["this", "host", "up", "host:", "idle"]


def test_status_lists_the_host_slot_with_its_job(tmp_path: Path, capsys: Any) -> None:
    """Host jobs have a slot of their own beside the engines' (SPEC §11): `status` lists it with the job it runs (the
    table showed only the engines, while STATUS= and the dashboard showed the host job)."""
    path = status_setup(tmp_path)
    store = Store(Path(yaml.safe_load(path.read_text())["state_dir"]) / "saigeedged.db")
    hosted = job("cls-9", target="host", state=RUNNING, step="quantize", step_index=4, step_count=7)
    begin_attempt(hosted, "host", T0)
    store.add(hosted)
    store.close()
    assert cli.main(["status", "-c", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split() == ["this", "host", "up", "host:", "cls", "quantize", "4/7"]


def running_rows(tmp_path: Path, rows: list[tuple[str, str, str, int, int, str, bool]]) -> tuple[Path, Store]:
    """A config whose engine `local` has a cubie and a mobilint slot, and running jobs in a real store: (job_id,
    target, step, index, count, started_at, handed to the finishing stage as a worker records it)."""
    path = write_config(tmp_path)
    store = Store(Path(yaml.safe_load(path.read_text())["state_dir"]) / "saigeedged.db")
    store.set_engine("local", True, None, ["cubie", "mobilint"])
    for job_id, target, step, index, count, at, handed in rows:
        running = job(job_id, target, state=RUNNING, step=step, step_index=index, step_count=count)
        begin_attempt(running, "local" if target == "cubie" else "host", at)
        store.add(running)
        if handed:
            store.mark_finishing(Attempt.of(running), True)
    return path, store


def status_of(path: Path, store: Store, capsys: Any) -> tuple[list[tuple[str, str, str | None]], str, list[str]]:
    """The dashboard's slots, then `saigeedged status`: the local engine's line and its last two lines."""
    from saigeedged.config import load
    from saigeedged.service.ops import Ops

    slots = [(s.engine, s.target, s.job.name if s.job else None) for s in Ops(load(path), store).view().slots]
    store.close()
    assert cli.main(["status", "-c", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    (local,) = [line for line in lines if line.startswith("local ")]
    return slots, local, lines[-2:]


def test_status_names_the_job_a_slot_runs_and_lists_the_finishing_one_apart(tmp_path: Path, capsys: Any) -> None:
    """sl1 handed to the finishing stage (its bundle step) while sl2 compiles in local's cubie slot, and a host job
    handed over publishing while the host slot is free: the slot lines (`status`, the dashboard) name sl2 and an idle
    host slot, and `status` lists the two others as finishing (the cubie slot said `sl1 bundle 10/11`, sl2 nowhere)."""
    path, store = running_rows(tmp_path, [("sl1-1", "cubie", "bundle", 10, 11, T0, True),
                                          ("sl2-2", "cubie", "quantize", 8, 11, T1, False),
                                          ("hp-3", "host", "publish", 8, 8, T2, True)])
    slots, local, last = status_of(path, store, capsys)
    assert slots == [("local", "cubie", "sl2"), ("local", "mobilint", None), ("this host", "host", None)]
    assert local.split() == ["local", "up", "cubie:", "sl2", "quantize", "8/11;", "mobilint:", "idle"]
    assert last == ["this host        up    host: idle",
                    "finishing        -     cubie: sl1 bundle 10/11; host: hp publish 8/8"]


def test_a_job_handed_over_in_its_last_compile_step_leaves_its_slot_to_the_next(tmp_path: Path, capsys: Any) -> None:
    """sl1 handed over while still in `export` (it waits for a finisher: its step is its last compile step's) and
    sl2 compiling in its slot since: the slot names sl2 (it named sl1, the older, and sl2 was nowhere)."""
    path, store = running_rows(tmp_path, [("sl1-1", "cubie", "export", 9, 11, T0, True),
                                          ("sl2-2", "cubie", "quantize", 5, 11, T1, False)])
    slots, local, last = status_of(path, store, capsys)
    assert slots[0] == ("local", "cubie", "sl2")
    assert local.split() == ["local", "up", "cubie:", "sl2", "quantize", "5/11;", "mobilint:", "idle"]
    assert last[-1] == "finishing        -     cubie: sl1 export 9/11"


def test_a_job_its_own_worker_publishes_is_its_slots(tmp_path: Path, capsys: Any) -> None:
    """Jobs not handed over (the stage's backlog of jobs was full, a Slurm job with a simulator report) bundle and
    publish in their own worker: their slots name them (they showed idle, the jobs listed as finishing)."""
    path, store = running_rows(tmp_path, [("sl3-1", "cubie", "publish", 11, 11, T0, False),
                                          ("hp-2", "host", "bundle", 7, 8, T1, False)])
    slots, local, last = status_of(path, store, capsys)
    assert slots == [("local", "cubie", "sl3"), ("local", "mobilint", None), ("this host", "host", "hp")]
    assert local.split() == ["local", "up", "cubie:", "sl3", "publish", "11/11;", "mobilint:", "idle"]
    assert last[-1] == "this host        up    host: hp bundle 7/8" and not any("finishing" in line for line in last)


def test_the_hand_over_is_fenced_and_a_new_take_clears_it(tmp_path: Path) -> None:
    """Store.mark_finishing writes the row of the attempt it names only (Superseded after it), and a job taken again
    (requeued, retried) is no longer the finishing stage's."""
    import pytest

    from saigeedged.jobs import Superseded

    store = Store(tmp_path / "saigeedged.db")
    store.add(job("sl1-1"))
    taken = store.take("sl1-1", "local", T0)
    assert taken is not None and not taken.finishing
    store.mark_finishing(Attempt.of(taken), True)
    assert store.get("sl1-1").finishing  # type: ignore[union-attr]
    requeued = store.get("sl1-1")
    assert requeued is not None
    requeued.state = QUEUED
    store.save(requeued, fence=Attempt.of(taken))
    with pytest.raises(Superseded):
        store.mark_finishing(Attempt.of(taken), False)
    again = store.take("sl1-1", "local", T1)
    assert again is not None and not again.finishing and not store.get("sl1-1").finishing  # type: ignore[union-attr]
    store.close()


def test_status_of_a_job_names_its_engine_and_attempts(tmp_path: Path, capsys: Any) -> None:
    """`saigeedged status JOB` shows the engine of the attempt and each attempt (--json: the status document's)."""
    path = status_setup(tmp_path)
    assert cli.main(["status", "det-1", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert "engine compile2" in out and f"attempt 1 on compile2 since {T0}" in out
    assert cli.main(["status", "det-1", "--json", "-c", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["engine"] == "compile2" and doc["attempts"][0]["engine"] == "compile2"


def test_status_numbers_attempts_as_the_status_file_does_after_a_retry(tmp_path: Path, capsys: Any) -> None:
    """A failed job retried: `status JOB` says its next attempt is 2, queued (the status file's `attempt`), and once
    a slot takes it, attempt 2 runs there; the failed one stays attempt 1 with how it ended."""
    path = status_setup(tmp_path)
    db = Path(yaml.safe_load(path.read_text())["state_dir"]) / "saigeedged.db"
    store = Store(db)
    failed = store.get("det-1")
    assert failed is not None
    end_attempt(failed, T1, "TIMEOUT")
    inputs = Path(yaml.safe_load(path.read_text())["inbox"]) / ".saigeedged" / "failed" / "det-1"
    inputs.mkdir(parents=True)  # its inputs, kept for a retry
    failed.state, failed.claim_dir = FAILED, str(inputs)
    store.save(failed)
    store.close()
    assert cli.main(["retry", "det-1", "-c", str(path)]) == 0
    capsys.readouterr()
    assert cli.main(["status", "det-1", "-c", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [f"attempt 1 on compile2 {T0} .. {T1}: TIMEOUT", "attempt 2 queued"]
    store = Store(db)
    assert store.take("det-1", "local", T2) is not None
    store.close()
    assert cli.main(["status", "det-1", "-c", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [f"attempt 1 on compile2 {T0} .. {T1}: TIMEOUT",
                                                         f"attempt 2 on local since {T2}"]


def test_status_without_engines_lists_the_one_local_engine(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """Without `engines:` the one local engine is a pool of one (SPEC §15): `status` prints the job table, then that
    engine as the monitor recorded it (down, with why and since when), and a job's attempts."""
    store = Store(tmp_path / "state" / "saigeedged.db")
    store.set_engine("local", False, "does not answer", ["cubie", "mobilint"])
    store.add(job("det-1"))
    store.close()
    assert cli.main(["status", "-c", str(config_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("JOB") and lines[-3].startswith("ENGINE")
    assert lines[-2].split()[:2] == ["local", "down"] and "does not answer, since" in lines[-2]
    assert lines[-1].split() == ["this", "host", "up", "host:", "idle"]  # host jobs' slot, whatever the engine's state
    assert cli.main(["status", "det-1", "-c", str(config_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["engine -", "attempt 1 queued"]


def test_dashboard_and_metrics_show_each_recorded_engine(tmp_path: Path) -> None:
    """With engines configured, the dashboard's slots and `saigeedged_engine_up` come from the engines table, and
    each ended job's attempts are counted per engine and error code."""
    from prometheus_client import generate_latest
    from test_metrics import samples, value

    from saigeedged.config import load
    from saigeedged.jobs import SUCCEEDED
    from saigeedged.service.ops import Ops

    path = status_setup(tmp_path)
    store = Store(tmp_path / "state" / "saigeedged.db")
    moved = job("seg-3", state=SUCCEEDED, finished_at=T3)
    begin_attempt(moved, "compile2", T0)
    end_attempt(moved, T1, "ENGINE_LOST")
    begin_attempt(moved, "local", T1)
    end_attempt(moved, T2, None, stopped=True)  # a restart: neither an error nor a success
    begin_attempt(moved, "local", T2)
    end_attempt(moved, T3, None)
    store.add(moved)
    ops = Ops(load(_with_metrics(path)), store)
    slots = [(s.engine, s.target, s.up, s.job.name if s.job else None) for s in ops.view().slots]
    assert slots == [("local", "cubie", True, None), ("local", "mobilint", True, None),
                     ("compile2", "cubie", False, "det"), ("this host", "host", True, None)]
    assert ops.metrics is not None
    found = samples(generate_latest(ops.metrics.registry).decode())
    assert value(found, "saigeedged_engine_up", engine="local") == 1
    assert value(found, "saigeedged_engine_up", engine="compile2") == 0
    assert value(found, "saigeedged_engine_attempts_total", engine="compile2", error_code="ENGINE_LOST") == 1
    assert value(found, "saigeedged_engine_attempts_total", engine="local", error_code="") == 1
    assert value(found, "saigeedged_engine_attempts_total", engine="local", error_code="stopped") == 1
    assert attempt_outcome(moved.attempts[1]) == "stopped" and attempt_outcome(moved.attempts[2]) == ""  # live path


def _with_metrics(path: Path) -> Path:
    data = yaml.safe_load(path.read_text())
    data["metrics"] = {"textfile": str(path.parent / "m.prom")}
    path.write_text(yaml.safe_dump(data))
    return path

"""Faults on the host target (issue 8): refused status files, blocked outbox folders, kills and a lost database."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from factory import classifier, yolox
from faults import bind_mount, full_fs, needs_root, set_read_only
from harness import drop, wait_for

from saigeedged.cli import main as cli
from saigeedged.intake import claims
from saigeedged.jobs import Job


@needs_root
def test_a_refused_final_status_is_written_after_a_restart(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """status/ read-only while logs/ takes the log: the job ends unseen; after a restart with status/ writable
    again its status file says succeeded (the "not yet written" mark survives the restart)."""
    d = daemon()
    with bind_mount(d.outbox / "status", read_only=True):
        drop(d.inbox, "unseen", det_inputs["onnx"], det_inputs["manifest"])
        done = wait_for(lambda: d.events("job.succeeded"), 60, "the job to end")[0]
        assert (d.outbox / "logs" / f"{done['job_id']}.log").is_file() and d.status(done["job_id"]) is None
        assert d.stop() == 0
    d.start()
    assert d.wait_state(done["job_id"], ("succeeded",), timeout=30)["bundle"]


def test_a_kill_between_a_jobs_end_and_its_status_file_is_caught_up_at_the_next_start(
        daemon: Any, det_inputs: dict[str, Any]) -> None:
    """What a daemon killed while it ended a job leaves (the row succeeded and the log moved, the inputs not yet
    deleted, the status file still `running`: it writes the status file last) is made good by the next start: the
    inputs are deleted and the status file says succeeded."""
    d = daemon()
    drop(d.inbox, "ending", det_inputs["onnx"], det_inputs["manifest"])
    done = d.wait_job("ending")
    assert done["state"] == "succeeded" and d.stop() == 0
    path = d.outbox / "status" / f"{done['job_id']}.json"
    path.write_text(json.dumps({**done, "state": "running", "step": "publish", "finished_at": None}))
    db = sqlite3.connect(d.state_dir / "saigeedged.db")
    try:  # the mark written with the ended row, cleared with the status file; the kill came before the inputs went
        assert db.execute("SELECT job_id FROM behind").fetchall() == []
        with db:
            db.execute("INSERT INTO behind (job_id, kind) VALUES (?, 'ending')", (done["job_id"],))
        claim = Path(db.execute("SELECT claim_dir FROM jobs WHERE job_id = ?", (done["job_id"],)).fetchone()[0])
    finally:
        db.close()
    claim.mkdir(parents=True)
    shutil.copyfile(det_inputs["onnx"], claim / "ending.onnx")
    d.start()
    assert d.wait_state(done["job_id"], ("succeeded",), timeout=30)["finished_at"] == done["finished_at"]
    assert not claim.exists()  # a succeeded job's inputs deleted before its status file says so


def test_a_blocked_status_folder_neither_aborts_a_claim_nor_fails_its_jobs(daemon: Any,
                                                                          det_inputs: dict[str, Any]) -> None:
    """outbox/status is a file: both entries of a multi-model drop are claimed and compiled; once status/ can be
    made their status files arrive (succeeded)."""
    d = daemon()
    (d.outbox / "status").write_text("in the way")
    classifier(d.inbox / "cls.onnx", 3, (224, 224))
    (d.inbox / "det.onnx").write_bytes(det_inputs["onnx"].read_bytes())
    m = det_inputs["manifest"]
    (d.inbox / "pair.yml").write_text(yaml.safe_dump({"target": "host", "models": [
        {**m, "onnx": "det.onnx", "name": "pdet"},
        # the noise images' INT8 scores tie, so this classifier's mAP drop is noise (tests/test_daemon.py NOISE_MAP)
        {**m, "task": "mlc", "onnx": "cls.onnx", "name": "pcls", "accuracy": {"max_map_drop": 1.0}}]}))
    ended = wait_for(lambda: len(d.events("job.succeeded")) == 2 and d.events("job.succeeded"), 90, "both jobs")
    (d.outbox / "status").unlink()
    for e in ended:
        assert d.wait_state(e["job_id"], ("succeeded",), timeout=30)["name"] in ("pdet", "pcls")
    assert not list((d.inbox / ".saigeedged" / "claimed").iterdir())


def test_an_outbox_sub_folder_that_cannot_be_made_is_retried_not_internal(daemon: Any,
                                                                         det_inputs: dict[str, Any]) -> None:
    """<outbox>/sub is a file where the bundle's folder should be: publishing is retried (PUBLISH_FAILED, not
    INTERNAL) and the job succeeds, compiled once, when the folder can be made."""
    d = daemon()
    (d.outbox / "sub").write_text("in the way")
    drop(d.inbox / "sub", "nested", det_inputs["onnx"], det_inputs["manifest"])
    retrying = wait_for(lambda: d.events("publish.retrying"), 60, "a refused publish")[0]
    assert retrying["error_code"] == "PUBLISH_FAILED" and "sub" in retrying["message"]
    (d.outbox / "sub").unlink()
    done = d.wait_job("nested")
    assert (done["state"], done["attempt"], done["bundle"]["path"]) == ("succeeded", 1, "sub/nested.host.saigeedge")
    assert len([e for e in d.events("job.step") if e["step"] == "calibration"]) == 1


@needs_root
def test_a_full_outbox_keeps_the_built_bundles_until_it_has_room(daemon: Any, det_inputs: dict[str, Any],
                                                                tmp_path: Path) -> None:
    """No room for bundles: every job waits in its publish step with its bundle built; once there is room all
    succeed, each compiled once, at attempt 1."""
    with full_fs(tmp_path / "outbox") as filler:
        os.truncate(filler, filler.stat().st_size - 16 * 1024)  # room for status files and logs, not a bundle
        d = daemon()
        for seed, name in enumerate(("full1", "full2", "full3")):  # models of their own: no cache hit
            drop(d.inbox, name, yolox(tmp_path / f"{name}.onnx", size=(64, 64), seed=seed), det_inputs["manifest"])
        wait_for(lambda: len(d.events("publish.retrying")) >= 2, 60, "a refused publish tried again")
        filler.unlink()
        docs = [d.wait_job(name) for name in ("full1", "full2", "full3")]
        assert [(x["state"], x["attempt"]) for x in docs] == [("succeeded", 1)] * 3
        assert all((d.outbox / x["bundle"]["path"]).is_file() for x in docs)
        assert len([e for e in d.events("job.step") if e["step"] == "quantize"]) == 3 and not d.events("job.requeued")
        d.close()


@needs_root
def test_a_read_only_outbox_holds_publishing_and_status_files_until_it_is_writable(daemon: Any,
                                                                                  det_inputs: dict[str, Any],
                                                                                  tmp_path: Path) -> None:
    """The outbox remounted read-only (EROFS) mid-run: jobs wait to publish instead of failing INTERNAL, and
    once it is writable again they succeed and their status files say so."""
    with bind_mount(tmp_path / "outbox") as outbox:
        d = daemon()
        drop(d.inbox, "before", det_inputs["onnx"], det_inputs["manifest"])
        assert d.wait_job("before")["state"] == "succeeded"
        set_read_only(outbox, True)
        drop(d.inbox, "during", det_inputs["onnx"], det_inputs["manifest"])
        retrying = wait_for(lambda: d.events("publish.retrying"), 60, "a refused publish")[0]
        assert "Read-only" in retrying["message"]
        set_read_only(outbox, False)
        done = d.wait_job("during")
        assert (done["state"], done["attempt"]) == ("succeeded", 1) and not d.events("job.internal_error")
        assert not d.events("job.failed")
        d.close()


def test_a_claim_whose_row_cannot_be_written_ends_failed_with_a_status_file(daemon: Any,
                                                                          det_inputs: dict[str, Any]) -> None:
    """A complete claim whose row no database takes (here a priority beyond SQLite's 64 bits, as an older
    daemon's claim could hold): at start it ends failed with a status file and its files under failed/ instead of
    sitting in claimed/ unseen; the next drop still succeeds."""
    d = daemon()
    assert d.stop() == 0
    folder = d.inbox / ".saigeedged" / "claimed" / "huge-20261130T000000Z-abcdef"
    drop(d.inbox, "huge", det_inputs["onnx"], det_inputs["manifest"])
    files = [d.inbox / "huge.yml", d.inbox / "huge.onnx"]
    job = Job(job_id=folder.name, name="huge", target="host", task="detection", entry={"onnx": str(folder / "huge.onnx")},
              subdir="", claim_dir=str(folder), manifest="huge.yml", priority=2**70, created_at="2026-11-30T00:00:00Z")
    claims.write_record(folder, d.inbox, files)
    for path in files:
        os.rename(path, folder / path.name)
    claims.write_record(folder, d.inbox, files, [job])
    d.start()
    doc = d.wait_state(folder.name, ("failed",), timeout=30)
    assert "cannot be written" in doc["error"]["message"]
    assert (d.inbox / ".saigeedged" / "failed" / folder.name / "huge.onnx").is_file()
    assert not list((d.inbox / ".saigeedged" / "claimed").iterdir())
    drop(d.inbox, "next", det_inputs["onnx"], det_inputs["manifest"])
    assert d.wait_job("next")["state"] == "succeeded"


def test_claimed_folders_without_rows_are_settled_at_start(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """At start: a claimed folder without a row or a record ends failed with a status file and its files under
    failed/; an empty one is removed; temp files of interrupted outbox writes (a status file, a bundle) are removed."""
    d = daemon()
    assert d.stop() == 0
    claimed = d.inbox / ".saigeedged" / "claimed"
    (claimed / "stray-20261130T000000Z-abcdef").mkdir(parents=True)
    (claimed / "stray-20261130T000000Z-abcdef" / "stray.yml").write_text("task: detection\n")
    (claimed / "empty-20261130T000000Z-abcdef").mkdir()
    leftover = d.outbox / "status" / ".x-20261130T000000Z-abcdef.json.1.tmp"  # pid 1: never the daemon's
    leftover.parent.mkdir(parents=True, exist_ok=True)
    leftover.write_text("{")
    half_bundle = d.outbox / "sub" / ".m.host.saigeedge.1.tmp"
    half_bundle.parent.mkdir()
    half_bundle.write_bytes(b"PK")
    d.start()
    doc = d.wait_state("stray-20261130T000000Z-abcdef", ("failed",), timeout=10)
    assert doc["error"]["code"] == "INTERNAL" and "without a job" in doc["error"]["message"]
    assert (d.inbox / ".saigeedged" / "failed" / "stray-20261130T000000Z-abcdef" / "stray.yml").is_file()
    assert not list(claimed.iterdir())
    # the temp-file sweep runs beside the start-up, in a thread of its own
    wait_for(lambda: not leftover.exists() and not half_bundle.exists(), 10, "the temp files swept")


def test_the_job_database_deleted_while_running_loses_nothing(daemon: Any, det_inputs: dict[str, Any],
                                                              capsys: Any) -> None:
    """The job database deleted under the running daemon is written back from the open one: the jobs before and
    after are still known after a restart."""
    d = daemon()
    drop(d.inbox, "before", det_inputs["onnx"], det_inputs["manifest"])
    before = d.wait_job("before")
    for path in d.state_dir.glob("saigeedged.db*"):
        path.unlink()
    wait_for(lambda: d.events("store.restored"), 10, "the database restored")
    drop(d.inbox, "after", det_inputs["onnx"], det_inputs["manifest"])
    after = d.wait_job("after")
    assert d.stop() == 0
    d.start()
    for doc in (before, after):
        assert cli.main(["status", doc["job_id"], "--json", "-c", str(d.config)]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "succeeded"


def test_a_corrupt_job_database_is_one_line_and_exit_2(daemon: Any) -> None:
    """A job database that is not SQLite: `run` says so in one line naming the file and exits 2 (no traceback)."""
    d = daemon()
    assert d.stop() == 0
    db = d.state_dir / "saigeedged.db"
    for path in d.state_dir.glob("saigeedged.db-*"):
        path.unlink()
    db.write_bytes(b"not a database at all" * 100)
    run = subprocess.run([sys.executable, "-m", "saigeedged", "run", "-c", str(d.config)], capture_output=True,
                         text=True, timeout=60, env=d.env)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert str(db) in run.stderr and "mv" in run.stderr


def test_a_lost_job_database_is_rebuilt_from_claimed_and_status_files(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """Killed with jobs queued, then the database deleted: at start the claimed drops are queued again under their
    job ids and succeed; a queued job whose inputs are gone too ends failed instead of queued forever."""
    d = daemon()
    names = [f"lost{i}" for i in range(4)]
    for name in names:
        drop(d.inbox, name, det_inputs["onnx"], det_inputs["manifest"])
    claimed = wait_for(lambda: len(d.events("drop.claimed")) == 4 and d.events("drop.claimed"), 30, "4 claimed")
    d.kill()
    for path in d.state_dir.glob("saigeedged.db*"):
        path.unlink()
    ids = {e["job_name"]: e["job_id"] for e in claimed}
    gone = ids[names[-1]]
    if (d.status(gone) or {}).get("state") == "queued":
        shutil.rmtree(d.inbox / ".saigeedged" / "claimed" / gone)
    d.start()
    for name in names[:-1]:
        assert d.wait_state(ids[name], ("succeeded",), timeout=60)
    last = d.wait_state(gone, ("succeeded", "failed"), timeout=60)
    assert last["state"] == "succeeded" or "database was lost" in last["error"]["message"]


def test_a_claim_a_kill_interrupted_goes_back_to_the_inbox(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """What a kill between the renames of a claim leaves (its record, the manifest moved, the ONNX not yet): at
    start the manifest goes back beside its ONNX and the drop is claimed again and succeeds."""
    d = daemon()
    assert d.stop() == 0
    drop(d.inbox / "sub", "halfway", det_inputs["onnx"], det_inputs["manifest"])
    folder = d.inbox / ".saigeedged" / "claimed" / "halfway-20261130T000000Z-abcdef"
    files = [d.inbox / "sub" / "halfway.yml", d.inbox / "sub" / "halfway.onnx"]
    claims.write_record(folder, d.inbox / "sub", files)
    os.rename(files[0], folder / "halfway.yml")
    d.start()
    doc = d.wait_job("halfway")
    assert doc["state"] == "succeeded" and doc["bundle"]["path"] == "sub/halfway.host.saigeedge"
    assert not folder.exists() and d.events("claim.undone")

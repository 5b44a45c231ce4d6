"""Retention (SPEC §13): `saigeedged prune [--dry-run]` and the daemon's round after start, on files aged with utime."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import write_config
from harness import wait_for

from saigeedged import jobid
from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import Store
from saigeedged.cli import main as cli
from saigeedged.jobs import FAILED, QUEUED, RUNNING, SUCCEEDED, Job, entry_to_doc
from saigeedged.manifest import build_entry
from saigeedged.service.lifecycle import Places

DAY = 86400.0


class Seeded:
    """A queue and an outbox holding jobs of every kind, some of them 30 days old."""

    def __init__(self, tmp_path: Path) -> None:
        self.outbox = Outbox(tmp_path / "outbox")
        self.places = Places(tmp_path / "inbox", tmp_path / "state")
        self.store = Store(tmp_path / "state" / "saigeedged.db")
        self.jobs: dict[str, Job] = {}
        self.tmp = tmp_path

    def add(self, key: str, name: str, state: str, age_days: float, bundle: str | None = None) -> Job:
        when = jobid.utc_now() - timedelta(days=age_days)  # it ended then, and its files were written then
        folder = (self.places.failed if state == FAILED else self.places.claimed) / f"{key}-in"
        entry = build_entry(self.tmp / f"{name}.yml", {"task": "mlc", "num_classes": 3, "calib": "v.json",
                                                       "target": "host"}, name, drop=True)
        job = Job(job_id=jobid.new(key, when), name=name, target="host", task="mlc", entry=entry_to_doc(entry), subdir="",
                  claim_dir=str(folder), manifest=f"{name}.yml", state=state, created_at=jobid.iso(when),
                  finished_at=jobid.iso(when) if state in (SUCCEEDED, FAILED) else None)
        if state == SUCCEEDED:
            job.bundle = {"path": bundle or entry.output_name, "sha256": "0", "bytes": 1}
            if bundle is None:  # a given path is the test's to make
                (self.outbox.root / job.bundle["path"]).write_bytes(b"bundle")
        if state != SUCCEEDED:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.onnx").write_bytes(b"onnx")
        self.store.add(job)
        self.outbox.write_status(job)
        log = self.outbox.root / "logs" / f"{job.job_id}.log"
        log.parent.mkdir(exist_ok=True)
        log.write_text("log\n")
        old = time.time() - age_days * DAY
        for path in (self.outbox.status_path(job.job_id), log, folder):
            if path.exists():
                os.utime(path, (old, old))
        self.jobs[key] = job
        return job

    def files(self, key: str) -> list[Path]:
        job = self.jobs[key]
        found = [self.outbox.status_path(job.job_id), self.outbox.root / "logs" / f"{job.job_id}.log"]
        return found + ([Path(job.claim_dir)] if job.state == FAILED else [])


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    s = Seeded(tmp_path)
    (tmp_path / "outbox").mkdir()
    s.add("det1", "det", SUCCEEDED, 30)
    s.add("det2", "det", SUCCEEDED, 20)
    s.add("det3", "det", SUCCEEDED, 1)  # the newest det: its bundle is the one all three point at
    s.add("solo", "solo", SUCCEEDED, 30)
    s.add("bad", "bad", FAILED, 30)
    s.add("run", "solo", RUNNING, 30)  # not final: never touched, nor the bundle it is about to replace
    s.add("wait", "other", QUEUED, 30)
    return s


def prune(tmp_path: Path, capsys: Any, *args: str, **retention: float) -> list[str]:
    config = write_config(tmp_path, retention=retention)
    assert cli.main(["prune", *args, "-c", str(config)]) == 0
    return capsys.readouterr().out.splitlines()  # type: ignore[no-any-return]


def test_dry_run_lists_then_prune_removes_only_aged_final_jobs(tmp_path: Path, seeded: Seeded, capsys: Any) -> None:
    """max_age_days: old final jobs' status, log, bundle and failed/ inputs go; shared bundles, new and unfinished stay."""
    doomed = seeded.files("det1") + seeded.files("det2") + seeded.files("solo") + seeded.files("bad")
    listed = prune(tmp_path, capsys, "--dry-run", max_age_days=7)
    assert sorted(line.split()[2] for line in listed[:-1]) == sorted(str(p) for p in doomed)
    assert listed[-1] == "4 jobs, 9 files would be removed (dry run)"
    assert all(p.exists() for p in doomed)  # a dry run removes nothing
    done = prune(tmp_path, capsys, max_age_days=7)
    assert sorted(line.split()[1] for line in done[:-1]) == sorted(str(p) for p in doomed)
    assert not any(p.exists() for p in doomed)
    kept = seeded.files("det3") + seeded.files("run") + seeded.files("wait") + [Path(seeded.jobs["wait"].claim_dir)]
    assert all(p.exists() for p in kept) and (seeded.outbox.root / "det.host.saigeedge").is_file()
    assert (seeded.outbox.root / "solo.host.saigeedge").is_file()
    assert seeded.store.get(seeded.jobs["det1"].job_id) is not None  # the rows stay: `status` still answers


def test_keep_last_per_name_keeps_the_newest_whatever_their_age(tmp_path: Path, seeded: Seeded, capsys: Any) -> None:
    """keep_last_per_name alone prunes all but the newest N final jobs of each name; with an age, either rule keeps."""
    prune(tmp_path, capsys, keep_last_per_name=1)
    assert not any(p.exists() for p in seeded.files("det1") + seeded.files("det2"))
    assert all(p.exists() for p in seeded.files("det3") + seeded.files("solo") + seeded.files("bad"))
    lines = prune(tmp_path, capsys, "--dry-run", keep_last_per_name=1, max_age_days=7)
    assert lines == ["0 jobs, 0 files would be removed (dry run)"]


def test_retention_off_prunes_nothing(tmp_path: Path, seeded: Seeded, capsys: Any) -> None:
    """With both rules 0 (the default) prune says retention is off and removes nothing."""
    assert "retention is off" in prune(tmp_path, capsys)[0]
    assert all(p.exists() for key in seeded.jobs for p in seeded.files(key))


def test_daemon_prunes_after_start(daemon: Any, seeded: Seeded) -> None:
    """The daemon runs a retention round right after start (then daily) and says so in the journal."""
    d = daemon(retention={"max_age_days": 7})
    done = wait_for(lambda: d.events("retention.done"), 30, "the first retention round")
    # "run" (running, about to replace solo's bundle) goes back to the queue at start and, a host job, may have ended
    # before the round: then nothing protects solo's aged bundle any more and it goes too
    bundle = seeded.outbox.root / seeded.jobs["solo"].bundle["path"]  # type: ignore[index]
    assert done[0]["removed"] == 9 + (not bundle.exists())
    assert not any(p.exists() for p in seeded.files("det1") + seeded.files("bad"))
    assert sorted(e["job_id"] for e in d.events("retention.pruned")) == sorted(
        seeded.jobs[k].job_id for k in ("det1", "det2", "solo", "bad"))


def test_prune_never_follows_a_symlinked_folder_or_dots_out_of_the_outbox(tmp_path: Path, seeded: Seeded,
                                                                           capsys: Any) -> None:
    """A bundle folder of the share replaced by a symlink to elsewhere, or a bundle path with `..` in its row: the
    file outside stays (the job's own status file and log still go)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.host.saigeedge").write_bytes(b"not the outbox's")
    (tmp_path / "precious.host.saigeedge").write_bytes(b"not the outbox's either")
    (seeded.outbox.root / "teamA").symlink_to(elsewhere)
    for key, path in (("linked", "teamA/precious.host.saigeedge"), ("dots", "../precious.host.saigeedge")):
        seeded.add(key, key, SUCCEEDED, 30, bundle=path)
    listed = prune(tmp_path, capsys, "--dry-run", max_age_days=7)
    assert not any("precious" in line for line in listed)
    prune(tmp_path, capsys, max_age_days=7)
    assert (elsewhere / "precious.host.saigeedge").is_file() and (tmp_path / "precious.host.saigeedge").is_file()
    assert not seeded.outbox.status_path(seeded.jobs["linked"].job_id).exists()


def test_keep_rows_days_deletes_old_rows_with_their_files_and_kept_rows_answer(tmp_path: Path, seeded: Seeded,
                                                                              capsys: Any) -> None:
    """keep_rows_days: a pruned job that ended that long ago loses its row too (`status` forgets it); a job a rule
    keeps, or one not final, keeps its row and `status` still answers for it."""
    listed = prune(tmp_path, capsys, "--dry-run", max_age_days=7, keep_rows_days=10)
    assert listed[-1] == "4 jobs, 9 files, 4 rows would be removed (dry run)"
    done = prune(tmp_path, capsys, max_age_days=7, keep_rows_days=10)
    assert done[-1] == "4 jobs, 9 files removed, 4 rows deleted"
    for key in ("det1", "det2", "solo", "bad"):
        assert seeded.store.get(seeded.jobs[key].job_id) is None
        assert not any(p.exists() for p in seeded.files(key))
    config = write_config(tmp_path, retention={"max_age_days": 7, "keep_rows_days": 10})
    for key in ("det3", "run", "wait"):
        assert cli.main(["status", seeded.jobs[key].job_id, "-c", str(config)]) == 0
        assert seeded.jobs[key].job_id in capsys.readouterr().out
    assert cli.main(["status", seeded.jobs["det1"].job_id, "-c", str(config)]) == 2  # INPUT_NOT_FOUND: forgotten

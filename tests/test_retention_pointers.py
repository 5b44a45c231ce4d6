"""Retention (SPEC §13) and what still shows a pruned job from its row: `status` and the dashboard name none of its
files once they are gone, since a later job may publish at its freed bundle path."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from conftest import write_config

from saigeedged import config, jobid
from saigeedged.adapters import dashboard
from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import Store
from saigeedged.cli import main as cli
from saigeedged.jobs import FAILED, QUEUED, SUCCEEDED, Job, entry_to_doc
from saigeedged.manifest import build_entry
from saigeedged.service.ops import Ops


class Published:
    """A queue and an outbox where jobs of one name publish real bundles, as the finishing stage does."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.outbox = Outbox(tmp_path / "outbox")
        self.store = Store(tmp_path / "state" / "saigeedged.db")
        self.config = write_config(tmp_path, dashboard=True, retention={"keep_last_per_name": 1})

    def job(self, key: str, age_days: float, state: str = SUCCEEDED) -> Job:
        """A final job of name `rp` that ended `age_days` ago, with its status file, log and (succeeded) bundle."""
        when = jobid.utc_now() - timedelta(days=age_days)
        entry = build_entry(self.tmp / "rp.yml", {"task": "mlc", "num_classes": 3, "calib": "v.json", "target": "host"},
                            "rp", drop=True)
        job = Job(job_id=jobid.new("rp", when), name="rp", target="host", task="mlc", entry=entry_to_doc(entry),
                  subdir="", claim_dir=str(self.tmp / "inbox" / "claimed" / f"{key}-in"), manifest="rp.yml", state=state,
                  created_at=jobid.iso(when), finished_at=jobid.iso(when))
        if state == SUCCEEDED:
            built = self.tmp / f"{key}.saigeedge"
            built.write_bytes(f"the model of {key}".encode())
            job.bundle = self.outbox.publish_bundle(built, Path(entry.output_name), job.job_id)
        self.store.add(job)
        self.outbox.write_status(job)
        self.outbox.move_log(self._log(key), job.job_id)
        return job

    def _log(self, key: str) -> Path:
        local = self.tmp / "state" / "logs" / f"{key}.log"
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(f"log of {key}\n")
        return local

    def cli(self, capsys: Any, *args: str) -> str:
        assert cli.main([*args, "-c", str(self.config)]) == 0
        return str(capsys.readouterr().out)

    def row_html(self, job_id: str) -> str:
        """The dashboard's row of `job_id`, as the daemon renders it from the queue."""
        page = dashboard.render(Ops(config.load(self.config), self.store).view())
        found = re.search(f'<tr id="{re.escape(job_id)}">.*?</tr>', page)
        assert found is not None
        return found.group(0)


def test_a_pruned_jobs_status_and_dashboard_row_never_point_at_the_next_bundle_there(tmp_path: Path,
                                                                                      capsys: Any) -> None:
    """A's files pruned, C published at A's freed bundle path: `status A` and A's dashboard row say pruned and name
    neither C's bundle nor A's removed log and status file; C's bundle survives the next round."""
    s = Published(tmp_path)
    a = s.job("a", 3)
    assert a.bundle is not None and a.bundle["path"] == "rp.host.saigeedge"
    b = s.job("b", 2)
    assert b.bundle is not None and b.bundle["path"] != a.bundle["path"]  # the path is taken: a name of its own
    listed = s.cli(capsys, "prune", "--dry-run")
    assert "rp.host.saigeedge " in listed
    assert s.store.get(a.job_id).to_doc().get("pruned_at") is None  # type: ignore[union-attr]  # a dry run marks nothing
    s.cli(capsys, "prune")
    assert not (s.outbox.root / "rp.host.saigeedge").exists() and not s.outbox.status_path(a.job_id).exists()
    c = s.job("c", 0)
    assert c.bundle is not None and c.bundle["path"] == "rp.host.saigeedge"  # the freed path, C's model now

    doc = json.loads(s.cli(capsys, "status", a.job_id, "--json"))  # from the row: A's status file is gone
    assert doc["job_id"] == a.job_id and doc["bundle"] is None and doc["log"] is None
    row = s.row_html(a.job_id)
    assert "rp.host.saigeedge" not in row and f"logs/{a.job_id}" not in row and f"status/{a.job_id}" not in row
    assert "pruned" in row and "<a " not in row and "rp.host.saigeedge" in s.row_html(c.job_id)
    assert doc["pruned_at"] is not None and "pruned" in s.cli(capsys, "status", a.job_id)
    listing = {d["job_id"]: d for d in json.loads(s.cli(capsys, "status", "--json"))}
    assert listing[a.job_id]["bundle"] is None and listing[c.job_id]["bundle"] == c.bundle

    s.outbox.write_status(s.store.get(a.job_id))  # type: ignore[arg-type]  # left by a crash before its unlink
    assert json.loads(s.cli(capsys, "status", a.job_id, "--json"))["bundle"] is None  # the row's word, not the file's
    assert cli.main(["retry", a.job_id, "-c", str(s.config)]) == 2  # its inputs are gone: said, not queued to fail
    assert "was pruned" in capsys.readouterr().err
    s.cli(capsys, "prune")  # B goes now; A's row still names the path, which is C's: it stays
    assert (s.outbox.root / "rp.host.saigeedge").read_bytes() == b"the model of c"
    assert s.store.get(c.job_id).pruned_at is None  # type: ignore[union-attr]


def test_the_mark_lands_only_on_the_run_planned_and_a_retry_clears_it(tmp_path: Path) -> None:
    """mark_pruned needs the row final with the planned end (a retry meanwhile: not marked); a row marked before the
    retry loses the mark when it goes back to the queue; a row stored before the field existed loads unmarked."""
    s = Published(tmp_path)
    job = s.job("f", 3, FAILED)
    assert not s.store.mark_pruned(job.job_id, "2000-01-01T00:00:00.000Z", "2030-01-01T00:00:00.000Z")
    assert s.store.mark_pruned(job.job_id, job.finished_at, "2030-01-01T00:00:00.000Z")
    assert s.store.mark_pruned(job.job_id, job.finished_at, "2031-01-01T00:00:00.000Z")  # the first time stays
    retried = s.store.get(job.job_id)
    assert retried is not None and retried.pruned_at == "2030-01-01T00:00:00.000Z"
    retried.state, retried.finished_at = QUEUED, None
    s.store.save(retried)
    assert s.store.get(job.job_id).pruned_at is None  # type: ignore[union-attr]
    assert not s.store.mark_pruned(job.job_id, job.finished_at, "2032-01-01T00:00:00.000Z")  # not final: no mark
    old = job.to_doc()
    del old["pruned_at"]
    assert Job.from_doc(old).pruned_at is None

"""Final jobs seen once each, whoever ended them (ends.py: what notifications and the job counters are fed)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from saigeedged import jobid
from saigeedged.adapters.ends import Ends
from saigeedged.adapters.store import Store
from saigeedged.jobs import FAILED, Job


def ended(store: Store, key: str, finished_at: str) -> Job:
    job = Job(job_id=f"{key}-1", name=key, target="host", task="mlc", entry={"onnx": "a.onnx"}, subdir="",
              claim_dir="/c", manifest="m.yml", state=FAILED, created_at=finished_at, finished_at=finished_at,
              error={"code": "INTERNAL", "message": "x", "hint": "y", "step": None})
    store.add(job)
    return job


def test_an_end_stamped_in_the_future_does_not_hide_later_ends(tmp_path: Path) -> None:
    """A job that ended while the clock ran a year ahead (set back since): it is returned once, and every end
    after it is still returned (before, nothing was until the clock caught up)."""
    store = Store(tmp_path / "saigeedged.db")
    ends = Ends(store)
    ahead = ended(store, "ahead", jobid.iso(jobid.utc_now() + timedelta(days=365)))
    assert [j.job_id for j in ends.fresh()] == [ahead.job_id]
    later = ended(store, "later", jobid.iso(jobid.utc_now()))
    assert [j.job_id for j in ends.fresh()] == [later.job_id]
    assert ends.fresh() == []

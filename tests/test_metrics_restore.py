"""The metrics a restart rebuilds from the job database alone (no daemon: a Store and the registry, collected)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from saigeedged import jobid
from saigeedged.adapters.metrics import Metrics
from saigeedged.adapters.store import Store
from saigeedged.adapters.tally import NAME, Tally
from saigeedged.jobs import FAILED, SUCCEEDED, Job

REPORT = {"method": "host", "images": 4, "outputs": {"out0": {"cosine": 0.991}, "out1": {"cosine": 0.987}},
          "task": {"score_cosine": 0.995}}


def ended(store: Store, key: str, ago_s: float, accuracy: dict[str, Any] | None = None) -> Job:
    at = jobid.iso(jobid.utc_now() - timedelta(seconds=ago_s))
    job = Job(job_id=f"{key}-1", name=key, target="host", task="detection", entry={"onnx": "a.onnx"}, subdir="",
              claim_dir=f"/c/{key}", manifest="m.yml", state=SUCCEEDED if accuracy else FAILED, created_at=at,
              started_at=at, finished_at=at, accuracy=accuracy,
              error=None if accuracy else {"code": "CALIB_INVALID", "message": "x", "hint": "y", "step": "calibration"})
    store.add(job)
    return job


def cosine_gauges(metrics: Metrics) -> dict[tuple[str, str], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.labels["target"], s.labels["task"]): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "saigeedged_accuracy_cosine"}


def test_accuracy_gauge_is_set_after_a_restart_from_the_stored_rows(tmp_path: Path) -> None:
    """The last measured job ended an hour before a later, unmeasured one: a new process's first collection shows
    its worst cosine (before, the gauge stayed empty until the next measured job)."""
    store = Store(tmp_path / "saigeedged.db")
    ended(store, "measured", 3600, REPORT)
    ended(store, "later", 10)
    assert cosine_gauges(Metrics(store, dict)) == {("host", "detection"): 0.987}


def test_accuracy_gauge_after_an_upgrade_from_a_summary_without_it(tmp_path: Path) -> None:
    """A summary kept by an older release (no accuracy in it) that already counted the measured job: the gauge is
    read once from the rows it summed, and the summary keeps it from then on."""
    store = Store(tmp_path / "saigeedged.db")
    ended(store, "measured", 7200, REPORT)
    ended(store, "later", 10)
    old = Tally.load(store)
    old.add(store, jobid.iso(jobid.utc_now() - timedelta(seconds=60)), (1.0, float("inf")))
    doc = dict(old.__dict__)
    doc.pop("accuracy")
    store.set_tally(NAME, doc)
    assert cosine_gauges(Metrics(store, dict)) == {("host", "detection"): 0.987}
    kept = store.tally(NAME) or {}
    assert kept["accuracy"]["host|detection"][1] == 0.987

"""The accuracy report off the container's path (issue 25): the finishing stage makes a job's report while the next
job's container steps run; a stop during the report redoes the report, never the compile (SPEC §15, §17)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from factory import random_labels, valjson
from harness import container_output, drop
from realmodels import yolox_nano

pytestmark = pytest.mark.docker


def _cubie_daemon(daemon: Any, docker_config: Path) -> Any:
    settings = yaml.safe_load(docker_config.read_text())
    return daemon(cubie=settings["cubie"], mobilint=settings["mobilint"], limits=settings["limits"],
                  defaults={"target": "cubie"})


def test_the_next_job_compiles_while_the_report_is_made(docker_config: Path, daemon: Any, tmp_path: Path) -> None:
    """A cubie job hands its report to the finishing stage after its last container step: the next job starts (and
    runs its container steps) before the first one ends, and both succeed with their reports, published."""
    d = _cubie_daemon(daemon, docker_config)
    calib = valjson(tmp_path / "data", random_labels(40, 3))
    fields = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 8}
    drop(d.inbox, "first", yolox_nano(tmp_path / "first.onnx", 320), fields)
    first = d.wait_job("first", ("running",))
    drop(d.inbox, "second", yolox_nano(tmp_path / "second.onnx", 320, seed=1), fields)
    done = [d.wait_job(name, timeout=180) for name in ("first", "second")]
    assert [j["state"] for j in done] == ["succeeded", "succeeded"], done
    assert all(j["accuracy"]["method"] == "emulated" and (d.outbox / j["bundle"]["path"]).is_file() for j in done)
    order = [(e["event"], e["job_name"]) for e in d.events() if e.get("event") in ("job.started", "job.succeeded",
                                                                                   "job.finishing")]
    assert order.index(("job.finishing", "first")) < order.index(("job.started", "second")) \
        < order.index(("job.succeeded", "first")), order
    assert first["job_id"] in {e["job_id"] for e in d.events("job.finishing")}


def test_a_stop_during_the_report_redoes_only_the_report(docker_config: Path, daemon: Any, docker_client: Any,
                                                         tmp_path: Path) -> None:
    """SIGTERM while a cubie job makes its accuracy report (step bundle, a 320 detector): the daemon exits 0, the next
    start re-attaches the job, which makes its report again and succeeds in attempt 1; import, quantize and export
    ran once in the container."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie_daemon(daemon, docker_config)
    calib = valjson(tmp_path / "data", random_labels(40, 3))
    drop(d.inbox, "det", yolox_nano(tmp_path / "det.onnx", 320),
         {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 8})
    job = d.wait_job("det", ("running",))
    d.wait_state(job["job_id"], ("running",), step="bundle", timeout=120)
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert d.status(job["job_id"])["state"] == "running"  # left to the next start, its attempt open
    d.start()
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=180)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), done
    assert done["accuracy"]["method"] == "emulated" and done["accuracy"]["images"] == 16
    ctr = docker_client.containers.get(settings["cubie"]["container"])
    record = container_output(ctr, ["cat", "/tmp/standin-calls.log"]).splitlines()
    for verb in ("import", "quantize", "export"):
        assert len([c for c in record if f"pegasus.py {verb} " in c]) == 1, (verb, record)
    log = (d.outbox / done["log"]).read_text()
    assert "re-attached in step bundle" in log and log.count("accuracy (emulated, 16 held-out images)") == 1

"""Publication as the finishing stage's: a cancel decided by the store at the bundle's rename (won before it, too late
after it), and a job without a report handed over too, so an outbox that refuses bundles holds no slot (SPEC §8, §15)."""

from __future__ import annotations

import io
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_config
from factory import random_labels, valjson
from harness import drop, wait_for
from realmodels import yolox_nano

from saigeedged import config as configmod
from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import Store
from saigeedged.cli import client
from saigeedged.cli import main as cli
from saigeedged.errors import SaigeError
from saigeedged.jobs import Attempt, CancelWins, Job
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.progress import Progress

QUANTIZE = "pegasus.py quantize "  # a quantize in the stand-in's record of its calls


def running(tmp_path: Path) -> tuple[Jobs, Job, Attempt]:
    """The lifecycle of the daemon configured by write_config(tmp_path), with a job taken by a worker (running, its
    attempt opened) and that attempt."""
    places = Places(tmp_path / "inbox", tmp_path / "state")
    places.make(tmp_path / "outbox")
    jobs = Jobs(Store(tmp_path / "state" / "saigeedged.db"), Outbox(tmp_path / "outbox"), places)
    jobs.add(Job(job_id="a-1", name="a", target="cubie", task="mlc", entry={"onnx": "/x.onnx"}, subdir="",
                 claim_dir=str(tmp_path / "claimed"), manifest="a.yml", created_at="t"))
    taken = jobs.take("a-1", "local")
    assert taken is not None
    return jobs, taken, Attempt.of(taken)


def built(tmp_path: Path) -> Path:
    """A built bundle in a work folder, ready to publish."""
    bundle = tmp_path / "work" / "a-1.saigeedge"
    bundle.parent.mkdir()
    bundle.write_bytes(b"a bundle")
    return bundle


def test_a_cancel_the_worker_has_not_heard_of_stops_the_bundle_at_its_rename(tmp_path: Path) -> None:
    """A cancel flagged in the store while the worker knows nothing of it yet: the publish ends CANCELLED at the
    rename, and the outbox holds no bundle and no temp file of it."""
    jobs, taken, attempt = running(tmp_path)
    assert jobs.store.request_cancel("a-1")
    told = Progress(jobs, taken, attempt, Path("a.saigeedge"), lambda: None, lambda: None, 5.0)
    with pytest.raises(SaigeError) as cancelled:
        told.publish(built(tmp_path))
    assert (cancelled.value.code, cancelled.value.fields["reason"]) == ("CANCELLED", "cancel")
    assert sorted(p.name for p in (tmp_path / "outbox").iterdir()) == ["status"]
    assert jobs.store.cancel_requested("a-1")  # still the worker's to settle: the job ends cancelled


def test_a_cancel_once_the_rename_began_is_refused_as_too_late(tmp_path: Path, capsys: Any) -> None:
    """Once the store marks a job's bundle as being published, `saigeedged cancel` exits 1 saying it is too late and
    flags nothing; a rename the outbox refused lets the next cancel through, and a cancel flagged first beats the
    rename (CancelWins)."""
    jobs, _, attempt = running(tmp_path)
    store, config = jobs.store, str(write_config(tmp_path))
    store.begin_publishing(attempt)
    assert cli.main(["cancel", "a-1", "-c", config]) == 1
    assert "too late to cancel" in capsys.readouterr().out and not store.cancel_requested("a-1")
    store.unpublishing(attempt)
    assert cli.main(["cancel", "a-1", "-c", config]) == 0 and store.cancel_requested("a-1")
    with pytest.raises(CancelWins):
        store.begin_publishing(attempt)


def test_a_publishing_mark_a_crash_left_is_forgotten_at_start(tmp_path: Path, capsys: Any) -> None:
    """A daemon killed between the mark and the job's end left it set: the re-attached job answered every cancel "too
    late" for good. The next start (Daemon.recover) clears it, and a cancel is heard again."""
    jobs, _, attempt = running(tmp_path)
    store, config = jobs.store, str(write_config(tmp_path))
    store.begin_publishing(attempt)
    assert store.forget_publishing() == 1 and not store.publishing("a-1")
    assert cli.main(["cancel", "a-1", "-c", config]) == 0 and store.cancel_requested("a-1")
    assert store.forget_publishing() == 0 and store.cancel_requested("a-1")  # a cancel's own flag stays


def _cubie(daemon: Any, docker_config: Path, **kwargs: Any) -> Any:
    settings = yaml.safe_load(docker_config.read_text())
    return daemon(cubie=settings["cubie"], mobilint=settings["mobilint"], limits=settings["limits"],
                  defaults={"target": "cubie"}, **kwargs)


def _ended_as_the_cli_said(d: Any, job_id: str, said: str, code: int) -> None:
    """The job's end agrees with what `saigeedged cancel` answered: cancelled without a bundle in the outbox, or
    succeeded with its bundle after a "too late"; the store's row, the status file and the journal alike."""
    done = d.wait_state(job_id, ("succeeded", "failed", "cancelled"), timeout=120)
    row = Store(d.state_dir / "saigeedged.db", verify=False).get(job_id)
    assert row is not None and row.state == done["state"]
    ended = {e["event"] for e in d.events() if e.get("job_id") == job_id and e.get("event", "").startswith("job.")}
    if code == 0:
        assert "cancel requested" in said and done["state"] == "cancelled", (said, done)
        assert "job.cancelled" in ended and "job.succeeded" not in ended
        assert not list(d.outbox.glob(f"sub/{done['name']}*")) and not list(d.outbox.glob("sub/.*"))
    else:
        assert (code, done["state"]) == (1, "succeeded") and "too late" in said, (said, done)
        assert "job.succeeded" in ended and (d.outbox / done["bundle"]["path"]).is_file()


@pytest.mark.docker
def test_a_cancel_in_the_finishing_steps_ends_as_the_cli_says(docker_config: Path, daemon: Any, tmp_path: Path) -> None:
    """Cubie jobs cancelled as soon as their status shows `bundle` or `publish` (the tester's drop): each either ends
    cancelled with nothing published, or the command said it came too late and the job succeeded (the lost cancel
    itself, flagged after the report's child ended, is test_a_cancel_the_worker_has_not_heard_of_...)."""
    d = _cubie(daemon, docker_config)
    calib = valjson(tmp_path / "data", random_labels(24, 3))
    fields = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 10, "cache": False}
    names = [f"late{n}" for n in range(3)]
    for n, name in enumerate(names):
        drop(d.inbox / "sub", name, yolox_nano(tmp_path / f"{name}.onnx", 320, seed=n), fields)
    for name in names:
        doc = wait_for(lambda name=name: next((s for s in d.statuses() if s["name"] == name and s["state"] == "running"
                                               and s["step"] in ("bundle", "publish")), None), 240, f"{name} finishing")
        out = io.StringIO()
        code = client.cancel(configmod.load(d.config), doc["job_id"], out)
        _ended_as_the_cli_said(d, doc["job_id"], out.getvalue(), code)


def _blocked_pair(d: Any, tmp_path: Path) -> list[dict[str, Any]]:
    """Two cubie jobs without a report dropped under sub/ while <outbox>/sub is a file: the first waits to publish in
    the finishing stage while the second runs its container steps; their running status documents."""
    (d.outbox / "sub").write_text("in the way")
    calib = valjson(tmp_path / "data", random_labels(12, 3))
    fields = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 4, "eval_samples": 0,
              "cache": False}
    for n, name in enumerate(("held", "next")):
        drop(d.inbox / "sub", name, yolox_nano(tmp_path / f"{name}.onnx", 320, seed=n), fields)
    wait_for(lambda: [e for e in d.events("publish.retrying") if e["job_name"] == "held"], 120, "held's refused publish")
    wait_for(lambda: [e for e in d.events("job.started") if e["job_name"] == "next"], 60,
             "the next job started while the first waits to publish")
    assert "held" in {e["job_name"] for e in d.events("job.finishing")}
    return [d.wait_job(name, ("running",)) for name in ("held", "next")]


@pytest.mark.docker
def test_a_refused_outbox_holds_no_slot_and_a_stop_does_not_recompile(docker_config: Path, daemon: Any,
                                                                     docker_client: Any, tmp_path: Path) -> None:
    """Jobs without a report (eval_samples 0) wait to publish in the finishing stage, so the next job compiles
    meanwhile; a stop while they wait, then an outbox that takes bundles again: both succeed in attempt 1, each
    quantized once in the container."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie(daemon, docker_config)
    held, nxt = _blocked_pair(d, tmp_path)
    wait_for(lambda: len({e["job_name"] for e in d.events("publish.retrying")}) == 2, 180, "both waiting to publish")
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    (d.outbox / "sub").unlink()
    d.start()
    done = [d.wait_state(j["job_id"], ("succeeded", "failed", "cancelled"), timeout=180) for j in (held, nxt)]
    assert [(j["state"], j["attempt"]) for j in done] == [("succeeded", 1)] * 2, done
    assert all((d.outbox / j["bundle"]["path"]).is_file() for j in done)
    ctr = docker_client.containers.get(settings["cubie"]["container"])
    record = ctr.exec_run(["cat", "/tmp/standin-calls.log"]).output.decode().splitlines()
    assert len([c for c in record if QUANTIZE in c]) == 2, record

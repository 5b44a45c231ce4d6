"""Publication as the finishing stage's: a cancel decided by the store at the bundle's rename (won before it, too late
after it), and a job without a report handed over too, so an outbox that refuses bundles holds no slot (SPEC §8, §15)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import zipfile
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
    assert store.forget_publishing() == ["a-1"] and not store.publishing("a-1")
    assert cli.main(["cancel", "a-1", "-c", config]) == 0 and store.cancel_requested("a-1")
    assert store.forget_publishing() == [] and store.cancel_requested("a-1")  # a cancel's own flag stays


def _bundle(path: Path, job_id: str) -> Path:
    """A zip whose checkpoint.yaml names `job_id` as the job it was built for, as a bundle's does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as bundle:
        bundle.writestr("checkpoint.yaml", yaml.safe_dump({"build": {"job_id": job_id}}))
    return path


def test_unpublish_removes_only_the_jobs_own_bundles(tmp_path: Path) -> None:
    """Outbox.unpublish removes the bundles built for the job at its name and at the name of its own it takes there,
    and leaves another job's bundle and a file that is no bundle alone."""
    outbox = Outbox(tmp_path / "outbox")
    own = _bundle(tmp_path / "outbox" / "sub" / "det.cubie.saigeedge", "det-20261205T000000Z-aaaaaa")
    also = _bundle(tmp_path / "outbox" / "sub" / "det.cubie.20261205T000000Z-aaaaaa.saigeedge",
                   "det-20261205T000000Z-aaaaaa")
    removed = outbox.unpublish(Path("sub/det.cubie.saigeedge"), "det-20261205T000000Z-aaaaaa")
    assert removed == [Path("sub/det.cubie.saigeedge"), Path("sub/det.cubie.20261205T000000Z-aaaaaa.saigeedge")]
    assert not own.exists() and not also.exists()
    other = _bundle(own, "det-20261204T000000Z-bbbbbb")
    plain = tmp_path / "outbox" / "sub" / "det.cubie.20261205T000000Z-aaaaaa.saigeedge"
    plain.write_text("not a zip")
    assert outbox.unpublish(Path("sub/det.cubie.saigeedge"), "det-20261205T000000Z-aaaaaa") == []
    assert other.is_file() and plain.is_file()
    with zipfile.ZipFile(plain, "w", zipfile.ZIP_DEFLATED) as damaged:  # its compressed member damaged on the share
        damaged.writestr("checkpoint.yaml", yaml.safe_dump({"build": {"job_id": "x" * 4000}}))
    data = bytearray(plain.read_bytes())
    data[30 + len("checkpoint.yaml")] = 0xFF  # the deflate stream's first block: of the reserved type
    plain.write_bytes(bytes(data))
    assert outbox.unpublish(Path("sub/det.cubie.saigeedge"), "det-20261205T000000Z-aaaaaa") == []  # raised zlib.error
    assert plain.is_file()


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


STRACE = shutil.which("strace")
HELD_S = 600  # how long the bundle's rename onto its name is held before it returns (the test kills the daemon first)


def _killed_after_the_link(d: Any, tmp_path: Path, calib: Path) -> dict[str, Any]:
    """A cubie detector `det` whose daemon is SIGKILLed with its bundle in the outbox and its row still running: the
    daemon runs under strace, which holds the bundle's link() onto its name once it is made (it returns no sooner
    than HELD_S), so the end the daemon writes right after it never comes. The daemon is then started again as is.
    The job's status (running)."""
    dest = d.outbox / "det.cubie.saigeedge"
    d.stop()
    d.prefix = [str(STRACE), "-f", "--seccomp-bpf", "-qq", "-o", "/dev/null", "-e", "trace=link", "-e",
                f"inject=link:delay_exit={HELD_S * 1_000_000}", "-P", str(dest)]
    d.start()
    drop(d.inbox, "det", yolox_nano(tmp_path / "det.onnx", 320), {"task": "detection", "num_classes": 3,
                                                                 "calib": str(calib), "n_samples": 8, "cache": False})
    job = d.wait_job("det", ("running",), timeout=120)
    wait_for(dest.exists, 120, "the bundle linked into the outbox")
    assert d.proc is not None
    (pid,) = [int(p) for p in Path(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children").read_text().split()]
    os.kill(pid, signal.SIGKILL)  # the daemon itself, strace's child, then strace (it waits out its delay otherwise)
    d.kill()
    assert d.status(job["job_id"])["state"] == "running"  # its end never written
    d.prefix = []
    d.start()
    return job


@pytest.mark.docker
@pytest.mark.skipif(STRACE is None, reason="holds a system call of the daemon with strace")
def test_a_crash_after_the_bundles_rename_publishes_it_once(docker_config: Path, daemon: Any, docker_client: Any,
                                                            tmp_path: Path) -> None:
    """SIGKILL once a cubie job's bundle is in the outbox and before its end is written: the next start re-attaches it
    (its report made again, never its compile) and it succeeds in attempt 1 with one bundle, under its own name, whose
    accuracy.json is the status file's (it left a second bundle, `det.cubie.<stamp>.saigeedge`, the first unrecorded)."""
    settings = yaml.safe_load(docker_config.read_text())
    d = _cubie(daemon, docker_config)
    calib = valjson(tmp_path / "data", random_labels(40, 3))
    job = _killed_after_the_link(d, tmp_path, calib)
    done = d.wait_state(job["job_id"], ("succeeded", "failed", "cancelled"), timeout=120)
    assert (done["state"], done["attempt"], done["bundle"]["path"]) == ("succeeded", 1, f"{job['name']}.cubie.saigeedge")
    assert [p.name for p in d.outbox.glob(f"{job['name']}.*")] == [f"{job['name']}.cubie.saigeedge"]
    with zipfile.ZipFile(d.outbox / done["bundle"]["path"]) as bundle:
        assert json.loads(bundle.read("accuracy.json")) == done["accuracy"]
    ctr = docker_client.containers.get(settings["cubie"]["container"])
    record = ctr.exec_run(["cat", "/tmp/standin-calls.log"]).output.decode().splitlines()
    assert len([c for c in record if QUANTIZE in c and job["job_id"] in c]) == 1, record


@pytest.mark.docker
@pytest.mark.skipif(STRACE is None, reason="holds a system call of the daemon with strace")
def test_a_cancel_after_a_crash_past_the_bundles_rename_leaves_no_bundle(docker_config: Path, daemon: Any,
                                                                         tmp_path: Path) -> None:
    """SIGKILL once a cubie job's bundle is in the outbox and before its end is written, then `saigeedged cancel` of
    the re-attached job: it ends as the command said, cancelled with no bundle of it in the outbox (the one the crash
    left stayed there, for a cancelled job), or too late and succeeded with its one bundle."""
    d = _cubie(daemon, docker_config)
    calib = valjson(tmp_path / "data", random_labels(40, 3))
    job = _killed_after_the_link(d, tmp_path, calib)
    out = io.StringIO()
    code = client.cancel(configmod.load(d.config), job["job_id"], out)
    done = d.wait_state(job["job_id"], ("succeeded", "failed", "cancelled"), timeout=120)
    left = sorted(p.name for p in d.outbox.glob(f"{job['name']}.*"))
    if code == 0:
        assert (done["state"], left) == ("cancelled", []), (out.getvalue(), done, left)
    else:
        assert (done["state"], left) == ("succeeded", [f"{job['name']}.cubie.saigeedge"]), (out.getvalue(), done, left)

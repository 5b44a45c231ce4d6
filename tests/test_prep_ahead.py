"""Prep-ahead (SPEC §11): the next queued job's host steps run while a container compiles, and nothing else changes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import write_config
from factory import yolox
from harness import drop, wait_for
from PIL import Image

from saigeedged import config as configmod
from saigeedged.adapters.store import Store
from saigeedged.cli import main as cli
from saigeedged.files import sha256_file
from saigeedged.jobs import Job, entry_to_doc
from saigeedged.manifest import load as load_manifest
from saigeedged.service.ahead import Preparer
from saigeedged.service.slot import work_dir

docker = pytest.mark.docker



def queued(config: Any, store: Any, name: str, onnx: Path, manifest: dict[str, Any], priority: int = 0) -> Job:
    """A job row as a claim makes it, its inputs in its own claimed folder."""
    folder = config.inbox / ".saigeedged" / "claimed" / name
    folder.mkdir(parents=True)
    (folder / f"{name}.onnx").write_bytes(onnx.read_bytes())
    (folder / f"{name}.yml").write_text(yaml.safe_dump(manifest))
    entry = load_manifest(folder / f"{name}.yml", config.section("defaults"), drop=True)[0]
    job = Job(job_id=name, name=name, target="cubie", task=entry.task, entry=entry_to_doc(entry), subdir="",
              claim_dir=str(folder), manifest=f"{name}.yml", priority=priority)
    store.add(job)
    return job


def test_preparer_keeps_the_window_and_hands_over_unchanged_preps(tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """In queue order, one job ahead per busy slot: a job pushed back by a higher priority loses its prep, the new
    head is prepared, and take() hands a prep over only for the attempt it was made for."""
    config = configmod.load(write_config(tmp_path, allowed_roots=[str(tmp_path / "data")]))
    store = Store(config.state_dir / "saigeedged.db")
    preparer = Preparer(config, store, config.inbox, lambda: (1, "compiling-job"))
    preparer.start()
    try:
        first = queued(config, store, "first", det_inputs["onnx"], det_inputs["manifest"])
        preparer.wake.set()
        wait_for(lambda: (config.work_root / "first" / "attempt1" / "dataset.txt").is_file(), 60, "first prepared")
        urgent = queued(config, store, "urgent", det_inputs["onnx"], det_inputs["manifest"], priority=5)
        preparer.wake.set()
        wait_for(lambda: (config.work_root / "urgent" / "attempt1" / "dataset.txt").is_file(), 60, "urgent prepared")
        wait_for(lambda: not (config.work_root / "first").exists(), 10, "first's prep thrown away")
        assert preparer.take(first, lambda: None) is None
        urgent.attempt, urgent.state = 2, "running"  # requeued and taken again meanwhile: made for attempt 1, not
        store.save(urgent)  # used; one write, as the store's take makes it (the preparer never sees it queued again)
        assert preparer.take(urgent, lambda: None) is None and not (config.work_root / "urgent").exists()
        store.save(Job.from_doc({**urgent.to_doc(), "attempt": 1, "state": "cancelled"}))
        preparer.wake.set()
        # its result, not a file its child writes: a take before the child answered would find the job no longer
        # queued and the prep thrown away
        wait_for(lambda: getattr(preparer._preps.get("first"), "result", None), 60, "first prepared again")
        first = store.take(first.job_id, "local", "2026-12-01T00:00:00Z") or first  # as a slot does: not queued now
        prep = preparer.take(first, lambda: None)
        assert prep is not None and prep.result is not None and prep.beside == "compiling-job"
        assert prep.result.onnx_sha256 == sha256_file(det_inputs["onnx"]) and len(prep.result.chosen) == 4
        assert prep.result.model.name == "first_surgery.onnx" and prep.result.model.is_file()
    finally:
        preparer.stop()
        preparer.join(10)
        store.close()


@pytest.fixture
def cubie_daemon(docker_config: Path, daemon: Any) -> Any:
    """daemon(...) with the stand-in container settings of docker_config, target cubie, debug events."""
    settings = yaml.safe_load(docker_config.read_text())

    def start(**overrides: Any) -> Any:
        return daemon(cubie=settings["cubie"], mobilint=settings["mobilint"], limits=settings["limits"],
                      defaults={"target": "cubie"}, log={"format": "json", "level": "debug"}, **overrides)

    return start


def compiling(d: Any, tmp_path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Drop a model whose quantize step never returns (the stand-in's `hang`); return it once it is in that step."""
    model = yolox(tmp_path / "hang.onnx", size=(64, 64), seed=zlib.crc32(b"hang"))
    drop(d.inbox, "hang", model, manifest)
    job: dict[str, Any] = d.wait_job("hang", ("running",))
    return d.wait_state(job["job_id"], ("running",), step="quantize")


def job_events(d: Any, name: str, job_id: str) -> list[dict[str, Any]]:
    return [e for e in d.events(name) if e.get("job_id") == job_id]


def prepared(d: Any, job_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = wait_for(lambda: job_events(d, "job.prepared", job_id), 60,
                                           f"job.prepared of {job_id}\n{d.stderr()[-2000:]}")
    return found[0]


def discarded(d: Any, job_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = wait_for(lambda: job_events(d, "job.prep_discarded", job_id), 60,
                                           f"job.prep_discarded of {job_id}\n{d.stderr()[-2000:]}")
    return found[0]


def cancel(d: Any, job_id: str) -> None:
    assert cli.main(["cancel", job_id, "-c", str(d.config)]) == 0


@docker
def test_next_job_is_prepared_while_one_compiles(cubie_daemon: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """The queued job's validate, surgery and calibration run while another job is in its quantize step; it stays
    queued meanwhile, and when it runs it goes straight to its container steps with the prepared inputs."""
    d = cubie_daemon()
    first = compiling(d, tmp_path, det_inputs["manifest"])
    drop(d.inbox, "second", det_inputs["onnx"], det_inputs["manifest"])
    second = d.wait_job("second", ("queued",))
    note = prepared(d, second["job_id"])
    assert note["beside"] == first["job_id"]
    assert d.status(first["job_id"])["step"] == "quantize" and d.status(first["job_id"])["state"] == "running"
    waiting = d.status(second["job_id"])
    assert (waiting["state"], waiting["step"], waiting["attempt"], waiting["error"]) == ("queued", None, 1, None)
    cancel(d, first["job_id"])
    done = d.wait_job("second")
    assert done["state"] == "succeeded" and done["step_count"] == 11
    assert done["inputs"]["onnx_sha256"] == sha256_file(det_inputs["onnx"]) and done["inputs"]["calib_samples"] == 4
    assert (d.outbox / done["bundle"]["path"]).is_file()
    log = (d.outbox / done["log"]).read_text()
    host = log[log.index("] validate ("):log.index("$ ")]  # from the first banner to the first container step
    assert host.count(f"prepared ahead while {first['job_id']} compiled") == 3
    assert "4 calibration images" in host and "cut at /head/Concat_output_0" in host


def test_nothing_is_prepared_while_a_worker_runs_its_own_host_steps(tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """A host job running beside a container compile holds a child of its own: the preparer chooses nothing until it is
    done (it chose, started a child that yielded at once, and chose again, every 0.2 s of the host job's run)."""
    config = configmod.load(write_config(tmp_path, allowed_roots=[str(tmp_path / "data")]))
    store = Store(config.state_dir / "saigeedged.db")
    hosting = [True]
    preparer = Preparer(config, store, config.inbox, lambda: (1, "compiling-job"), lambda: hosting[0])
    try:
        job = queued(config, store, "next", det_inputs["onnx"], det_inputs["manifest"])
        assert preparer._next() is None
        hosting[0] = False
        chosen = preparer._next()
        assert chosen is not None and chosen.job_id == job.job_id
    finally:
        store.close()


def test_a_job_a_slot_takes_while_the_preparer_chose_it_is_never_prepared(tmp_path: Path,
                                                                          det_inputs: dict[str, Any]) -> None:
    """The race of prep-ahead and a slot: the preparer picked the head of the queue, a slot took it before the prep
    began; the prep leaves the worker's work folder alone and hands nothing over."""
    config = configmod.load(write_config(tmp_path, allowed_roots=[str(tmp_path / "data")]))
    store = Store(config.state_dir / "saigeedged.db")
    preparer = Preparer(config, store, config.inbox, lambda: (1, "compiling-job"))  # not started: driven step by step
    try:
        job = queued(config, store, "raced", det_inputs["onnx"], det_inputs["manifest"])
        chosen = preparer._next()
        assert chosen is not None and chosen.job_id == job.job_id
        taken = store.take(job.job_id, "local", "2026-12-01T00:00:00Z")  # the slot wins the race
        assert taken is not None
        work = work_dir(config.work_root, taken)
        work.mkdir(parents=True)
        (work / "validate.txt").write_text("the worker's own")
        preparer._prepare(chosen)
        assert (work / "validate.txt").read_text() == "the worker's own" and not (work / "dataset.txt").exists()
        assert preparer.take(taken, lambda: None) is None
    finally:
        store.close()


@docker
def test_pool_slot_gets_the_prep_in_its_attempt_folder(cubie_daemon: Any, tmp_path: Path,
                                                       det_inputs: dict[str, Any]) -> None:
    """With engines: (a pool, one engine down), the queued job is prepared in work/<job>/attempt<N>, the folder its
    slot's worker uses for that attempt, and the slot then compiles it with the prepared inputs."""
    local = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    d = cubie_daemon(engines=[{"name": "local", "url": local, "targets": ["cubie"]},
                              {"name": "gone", "url": f"unix://{tmp_path / 'none.sock'}", "targets": ["cubie"]}])
    first = compiling(d, tmp_path, det_inputs["manifest"])
    drop(d.inbox, "second", det_inputs["onnx"], det_inputs["manifest"])
    second = d.wait_job("second", ("queued",))
    note = prepared(d, second["job_id"])
    assert note["beside"] == first["job_id"]
    work = d.state_dir / "work" / second["job_id"]
    assert (work / "attempt1" / "dataset.txt").is_file() and not (work / "dataset.txt").exists()
    cancel(d, first["job_id"])
    done = d.wait_job("second")
    assert done["state"] == "succeeded" and done["engine"] == "local"
    log = (d.outbox / done["log"]).read_text()
    assert log.count(f"prepared ahead while {first['job_id']} compiled") == 3


@docker
def test_cancelled_prepared_job_loses_its_prep(cubie_daemon: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """A prepared job cancelled while queued ends cancelled without starting; its prepared work folder goes, and the
    preparer moves on to the next queued job."""
    d = cubie_daemon()
    first = compiling(d, tmp_path, det_inputs["manifest"])
    drop(d.inbox, "gone", det_inputs["onnx"], det_inputs["manifest"])
    gone = d.wait_job("gone", ("queued",))
    prepared(d, gone["job_id"])
    work = d.state_dir / "work" / gone["job_id"]
    assert (work / "attempt1" / "dataset.txt").is_file()
    cancel(d, gone["job_id"])
    assert d.status(gone["job_id"])["state"] == "cancelled"
    wait_for(lambda: not work.exists(), 30, "the cancelled job's prepared work folder removed")
    drop(d.inbox, "next", det_inputs["onnx"], det_inputs["manifest"])
    nxt = d.wait_job("next", ("queued",))
    prepared(d, nxt["job_id"])
    cancel(d, first["job_id"])
    assert d.wait_job("next")["state"] == "succeeded"
    assert [e["job_name"] for e in d.events("job.started")] == ["hang", "next"]
    assert d.status(gone["job_id"])["state"] == "cancelled"


@docker
def test_failing_prep_is_reported_once_when_the_job_runs(cubie_daemon: Any, tmp_path: Path,
                                                          det_inputs: dict[str, Any]) -> None:
    """A prep that fails (an image that does not decode) changes nothing while the job waits; the job then fails
    with the same code at its own calibration step, and the failure is in the journal once."""
    d = cubie_daemon()
    first = compiling(d, tmp_path, det_inputs["manifest"])
    calib = Path(det_inputs["manifest"]["calib"])
    doc = json.loads(calib.read_text())
    broken = calib.parent / "images" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not a jpeg")
    doc["validation"] = [{"image": str(broken), "labels": [0]}]
    bad_calib = calib.with_name("bad.json")
    bad_calib.write_text(json.dumps(doc))
    drop(d.inbox, "bad", det_inputs["onnx"], {**det_inputs["manifest"], "calib": str(bad_calib)})
    bad = d.wait_job("bad", ("queued",))
    assert "CALIB_INVALID" in discarded(d, bad["job_id"])["reason"]
    waiting = d.status(bad["job_id"])
    assert (waiting["state"], waiting["error"], waiting["attempt"]) == ("queued", None, 1)
    assert not (d.state_dir / "work" / bad["job_id"]).exists()
    cancel(d, first["job_id"])
    done = d.wait_job("bad")
    assert done["state"] == "failed" and done["attempt"] == 1
    assert (done["error"]["code"], done["error"]["step"]) == ("CALIB_INVALID", "calibration")
    assert "broken.jpg" in done["error"]["message"]
    coded = [e["event"] for e in d.events() if e.get("job_id") == bad["job_id"] and e.get("error_code")]
    assert coded == ["job.failed"]
    assert "prepared ahead" not in (d.outbox / done["log"]).read_text()


@docker
def test_changed_input_is_prepared_again(cubie_daemon: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """A calibration file rewritten after the prep: the prep is thrown away and the job runs its host steps itself."""
    d = cubie_daemon()
    first = compiling(d, tmp_path, det_inputs["manifest"])
    own = Path(det_inputs["manifest"]["calib"]).with_name("own.json")
    own.write_text(Path(det_inputs["manifest"]["calib"]).read_text())
    drop(d.inbox, "edited", det_inputs["onnx"], {**det_inputs["manifest"], "calib": str(own)})
    edited = d.wait_job("edited", ("queued",))
    prepared(d, edited["job_id"])
    own.write_text(own.read_text())  # same content, written again: the dataset may have been replaced
    cancel(d, first["job_id"])
    done = d.wait_job("edited")
    assert done["state"] == "succeeded"
    assert "changed" in discarded(d, edited["job_id"])["reason"]
    assert "prepared ahead" not in (d.outbox / done["log"]).read_text()


def slow_calibration(folder: Path, count: int) -> Path:
    """A val.json over `count` copies of one large PNG (70 KB on disk): each decode takes a while, so the calibration
    check is long. Copies, not hard links: links of one file are one image, listed once (calibration.distinct)."""
    folder.mkdir(parents=True, exist_ok=True)
    pixels = np.full((4000, 4000, 3), 128, np.uint8)
    pixels[::7, ::5] = 3
    first = folder / "big0000.png"
    Image.fromarray(pixels).save(first)
    for i in range(1, count):
        shutil.copyfile(first, folder / f"big{i:04d}.png")
    rows = [{"image": str(folder / f"big{i:04d}.png"), "labels": [i % 3]} for i in range(count)]
    path = folder / "slow.json"
    path.write_text(json.dumps({"n_classes": 3, "validation": rows}))
    return path


@docker
def test_stop_during_prep(cubie_daemon: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """SIGTERM while a queued job is being prepared: the prep is cut short, the daemon exits 0, the job stays queued
    at its attempt with no prepared folder left, and the next start runs it from the beginning."""
    d = cubie_daemon()
    hang = compiling(d, tmp_path, det_inputs["manifest"])
    calib = slow_calibration(tmp_path / "data" / "slow", 30)
    manifest = {**det_inputs["manifest"], "calib": str(calib), "n_samples": 30, "priority": 1}
    drop(d.inbox, "slow", det_inputs["onnx"], manifest)
    slow = d.wait_job("slow", ("queued",))
    work = d.state_dir / "work" / slow["job_id"]
    wait_for(lambda: (work / "attempt1" / "slow_surgery.onnx").is_file(), 60, "the prep's surgery done, calibration checking")
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    assert "stop" in discarded(d, slow["job_id"])["reason"]
    assert not job_events(d, "job.prepared", slow["job_id"])
    waiting = d.status(slow["job_id"])
    assert (waiting["state"], waiting["attempt"], waiting["error"]) == ("queued", 1, None)
    assert not work.exists()
    d.close()
    again = cubie_daemon()
    wait_for(lambda: job_events(again, "job.reattached", hang["job_id"]), 30, "the hung step re-attached")
    assert cli.main(["cancel", hang["job_id"], "-c", str(again.config)]) == 0  # its step outlived the stop
    done = again.wait_job("slow", timeout=120)
    assert done["state"] == "succeeded", done["error"]
    assert done["attempt"] == 1 and done["inputs"]["calib_samples"] == 30

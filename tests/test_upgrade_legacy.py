"""An upgrade from the release before attempt records (main at 2f35d79) while a cubie step runs (SPEC §15, §16): the
new daemon rebuilds the attempt's record from what it can check (service/legacy.py) and the step runs once; a folder
that disagrees with its job is requeued."""

from __future__ import annotations

import dataclasses
import json
import signal
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from conftest import write_config
from factory import yolox
from harness import STANDIN_QUANTIZE, drop, release_standin, wait_for
from test_daemon_docker import calls, cubie_daemon, procs  # noqa: F401 - cubie_daemon is a fixture
from test_store_fence import job, lifecycle

from saigeedged import config as configmod
from saigeedged.adapters.store import SCHEMA_VERSION
from saigeedged.compile import ahead
from saigeedged.compile.inputs import PathPolicy
from saigeedged.jobs import entry_to_doc
from saigeedged.manifest import load as load_manifest
from saigeedged.service import legacy, slot
from saigeedged.service.recovery import Recovery

REPO = Path(__file__).parent.parent
PREVIOUS = "2f35d79"  # the release before attempt records: its attempts kept their facts in their work dirs
LEGACY_DEPS = Path(sys.prefix) / "legacy"  # what it imports that the current release does not (paramiko): scripts/venv


def previous_release(dest: Path) -> Path:
    """The package of the previous release, extracted from the repository's history under `dest`."""
    have = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], capture_output=True)
    if have.returncode != 0:
        pytest.fail(f"commit {PREVIOUS} (the previous release) is not in {REPO}'s history: a shallow clone? "
                    f"`git fetch --unshallow` gives it; this test needs it and must not be skipped")
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS, "saigeedged"], capture_output=True,
                             check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


@pytest.mark.docker
def test_upgrade_from_the_previous_release_during_quantize_keeps_attempt_1(cubie_daemon: Any, docker_client: Any,  # noqa: F811
                                                                          tmp_path: Path,
                                                                          det_inputs: dict[str, Any]) -> None:
    """The previous release's daemon is stopped during a quantize; the new one migrates the database (with its
    backup), rebuilds the attempt's record from the job and its work dir while the step still runs, and the job
    succeeds in attempt 1 with the same job_id and quantize run once."""
    old = previous_release(tmp_path / "previous")
    assert (LEGACY_DEPS / "paramiko").is_dir(), f"{LEGACY_DEPS}: scripts/venv installs paramiko there"
    d = cubie_daemon(env={"PYTHONPATH": f"{old}:{LEGACY_DEPS}", "PYTHONSAFEPATH": "1"})  # no cwd on sys.path: the old package
    name = "upgrade_untilreleased"  # the stand-in's quantize runs until the test releases it
    drop(d.inbox, name, yolox(tmp_path / f"{name}.onnx", size=(64, 64), seed=zlib.crc32(name.encode())),
         det_inputs["manifest"])
    first = d.wait_job(name, ("running",))
    d.wait_state(first["job_id"], ("running",), step="quantize")
    wait_for(lambda: calls(docker_client, d, "quantize"), 20, "the quantize step running")
    steps = d.state_dir / "work" / first["job_id"] / "attempt1" / ".steps"
    assert sorted(steps.glob("prepared.*")), "the previous release keeps its host steps in the work dir"
    d.signal(signal.SIGTERM)
    assert d.proc is not None and d.proc.wait(30) == 0
    assert (steps / "detached").exists() and STANDIN_QUANTIZE in procs(docker_client, d)
    for key in ("PYTHONPATH", "PYTHONSAFEPATH"):
        d.env.pop(key)
    d.start(ready_timeout=60)
    wait_for(lambda: d.events("job.reattached"), 120, "the new daemon re-attached", lambda: d.stderr()[-3000:])
    assert STANDIN_QUANTIZE in procs(docker_client, d)
    compiler = docker_client.containers.get(yaml.safe_load(d.config.read_text())["cubie"]["container"])
    release_standin(compiler)
    done = d.wait_state(first["job_id"], ("succeeded", "failed", "cancelled"), timeout=90)
    assert (done["state"], done["attempt"], done["job_id"]) == ("succeeded", 1, first["job_id"]), d.stderr()[-3000:]
    assert len(calls(docker_client, d, "quantize")) == 1
    assert [e["job_id"] for e in d.events("job.legacy_adopted")] == [first["job_id"]]
    assert not d.events("job.requeued") and not d.events("job.legacy_unresumable")
    db = d.state_dir / "saigeedged.db"
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with sqlite3.connect(db.with_name(f"{db.name}.bak-2")) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 2
        assert con.execute("SELECT state FROM jobs WHERE job_id = ?", (first["job_id"],)).fetchone() == ("running",)


def legacy_attempt(tmp_path: Path, det_inputs: dict[str, Any], folder_of: str = "a-1/attempt1") -> tuple[Any, Any, Path]:
    """A running job of the store whose attempt folder (`folder_of` under the work root) is laid out as the previous
    release left it mid-quantize (its host steps really run, a step's exec id, a stop marker), without an attempt
    record; its jobs, row and folder, which the daemon's work_dir finds."""
    folder = tmp_path / "data" / "claimed"
    folder.mkdir(parents=True)
    (folder / "det.onnx").write_bytes(det_inputs["onnx"].read_bytes())
    (folder / "det.yml").write_text(json.dumps(det_inputs["manifest"]))
    entry = load_manifest(folder / "det.yml", configmod.load(write_config(tmp_path)).section("defaults"), drop=True)[0]
    jobs = lifecycle(tmp_path)
    work = tmp_path / "work" / folder_of
    jobs.add(dataclasses.replace(job(), claim_dir=str(folder), entry=entry_to_doc(entry)))
    taken = jobs.take("a-1", "local", str(work))
    assert taken is not None
    with sqlite3.connect(tmp_path / "state" / "q.db") as db:  # the previous release wrote no record
        db.execute("DELETE FROM attempts")
    ahead.host_steps(entry, work, PathPolicy(None), None)
    (work / legacy.STEPS).mkdir()
    (work / legacy.STEPS / "1.exec").write_text("ab" * 32)
    (work / legacy.STEPS / "1.seen").write_text("120")
    (work / legacy.STEPS / "detached").touch()
    assert slot.work_dir(tmp_path / "work", taken) == work
    return jobs, taken, work


@pytest.mark.parametrize("folder_of", ["a-1/attempt1", "a-1"])
def test_a_legacy_attempt_that_agrees_is_recorded_and_resumed(tmp_path: Path, det_inputs: dict[str, Any],
                                                              folder_of: str) -> None:
    """A previous-release attempt (in an attempt folder, or in the one folder per job of the releases before) whose
    work dir agrees with its job gets a record (the prepared inputs, the steps' book, no crash for its stop) and goes
    on; the stop marker is gone from the folder."""
    jobs, taken, work = legacy_attempt(tmp_path, det_inputs, folder_of)
    config = configmod.load(write_config(tmp_path, allowed_roots=[str(tmp_path / "data")]))
    left = Recovery(jobs, 3, lambda j, w: legacy.rebuild(j, w, config)).attempt_left(taken, work)
    assert (left.resumable, left.crashes) == (True, 0)
    record = jobs.store.current_record(taken)
    assert record is not None and record.started and record.steps == {"1": {"exec": "ab" * 32, "seen": 120}}
    assert record.prepared is not None and record.prepared["dataset"] == str(work / "dataset.txt")
    assert not (work / legacy.STEPS / "detached").exists()


def test_a_legacy_attempt_whose_dataset_disagrees_is_requeued_not_resumed(tmp_path: Path,
                                                                          det_inputs: dict[str, Any]) -> None:
    """dataset.txt that does not list the seeded sampler's choice (one image fewer): not resumed, the journal says
    why, its record is made to reap its step, and the folder is not touched."""
    jobs, taken, work = legacy_attempt(tmp_path, det_inputs)
    dataset = work / "dataset.txt"
    dataset.write_text("\n".join(dataset.read_text().splitlines()[:-1]) + "\n")
    config = configmod.load(write_config(tmp_path, allowed_roots=[str(tmp_path / "data")]))
    with pytest.raises(legacy.Unresumable, match="dataset.txt"):
        legacy.rebuild(taken, work, config)
    with structlog.testing.capture_logs() as logged:
        left = Recovery(jobs, 3, lambda j, w: legacy.rebuild(j, w, config)).attempt_left(taken, work)
    assert not left.resumable
    said = [e for e in logged if e["event"] == "job.legacy_unresumable"]
    assert len(said) == 1 and "dataset.txt" in said[0]["message"] and said[0]["job_id"] == "a-1"
    record = jobs.store.current_record(taken)
    assert record is not None and record.prepared is None and record.steps == {}
    assert (work / legacy.STEPS / "detached").exists()


def test_a_legacy_attempt_keeps_its_crash_count(tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """The previous release's crash count (no stop marker: the daemon died) carries into the record, this death
    counted too, and the marker file is gone from the folder the container can write."""
    jobs, taken, work = legacy_attempt(tmp_path, det_inputs)
    (work / legacy.STEPS / "detached").unlink()
    (work / legacy.STEPS / "crashes").write_text("1")
    config = configmod.load(write_config(tmp_path, allowed_roots=[str(tmp_path / "data")]))
    left = Recovery(jobs, 3, lambda j, w: legacy.rebuild(j, w, config)).attempt_left(taken, work)
    assert (left.resumable, left.crashes) == (True, 2)
    assert not (work / legacy.STEPS / "crashes").exists()

"""Abandoned attempts and work folders (SPEC §15): each step reaped in its own container, once, by this daemon or the
next; a held job is not a crash; an engine without the image waits for the others; legacy folders upgrade safely."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_config
from engineproxy import EngineProxy
from factory import classifier
from harness import answered, container_output, drop, wait_for
from test_daemon_docker import cubie_daemon, in_quantize, procs  # noqa: F401 (cubie_daemon is a fixture)
from test_faults_docker import died_at_the_limit_on_a_hung_engine

from saigeedged import config as configmod
from saigeedged.adapters.docker import Engine
from saigeedged.adapters.store import Store
from saigeedged.engines import EngineSpec
from saigeedged.jobs import Job
from saigeedged.service.monitor import EngineMonitor
from saigeedged.service.slot import fresh_work_dir, remove_work, work_dir


def mobilint_procs(docker_client: Any, d: Any) -> str:
    name = yaml.safe_load(d.config.read_text())["mobilint"]["container"]
    try:
        return container_output(docker_client.containers.get(name), ["ps", "-o", "args"])
    except Exception:  # not created yet
        return ""


@pytest.mark.docker
def test_the_reap_of_a_mobilint_attempt_kills_its_step_when_the_cubie_container_runs(
        cubie_daemon: Any, docker_client: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:  # noqa: F811
    """A mobilint job the daemon died under at max_attempts: its step in the mobilint container is killed, even
    though the cubie container (which sees the same bind-mounted pidfile) is reaped first."""
    d = cubie_daemon(limits={"max_attempts": 1})
    drop(d.inbox, "warm", det_inputs["onnx"], det_inputs["manifest"])
    assert d.wait_job("warm")["state"] == "succeeded"  # the cubie container exists and runs
    m = {**det_inputs["manifest"], "task": "mlc", "target": "mobilint", "device": "regulus-rb"}
    drop(d.inbox, "qbhang", classifier(tmp_path / "qbhang.onnx", 3, (224, 224)), m)
    job = d.wait_job("qbhang", ("running",))
    wait_for(lambda: "sleep 100000" in mobilint_procs(docker_client, d), 60, "the mobilint step running")
    d.kill()
    d.start()
    assert d.wait_state(job["job_id"], ("failed",))["error"]["code"] == "INTERNAL"
    wait_for(lambda: not (d.state_dir / "work" / job["job_id"]).exists(), 30, "its work folder removed by the reap")
    wait_for(lambda: "sleep 100000" not in mobilint_procs(docker_client, d), 10, "the mobilint step killed")


@pytest.mark.docker
def test_a_clean_restart_while_the_job_is_held_is_not_counted_as_a_crash(
        cubie_daemon: Any, docker_client: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:  # noqa: F811
    """A job held (its engine does not answer) when the daemon is stopped with SIGTERM stays running at the next start:
    a clean stop is not a daemon dying under it (max_attempts 1 would fail it at once)."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    d = cubie_daemon(env={"DOCKER_HOST": proxy.docker_host}, limits={"max_attempts": 1})
    job = in_quantize(d, docker_client, tmp_path, "hang", det_inputs["manifest"])
    proxy.down()
    wait_for(lambda: d.events("job.waiting"), 30, "the job held")
    assert d.stop() == 0
    d.start()
    doc = d.status(job["job_id"])
    assert doc is not None and doc["state"] == "running", doc and doc["error"]


@pytest.mark.docker
def test_a_reap_pending_at_a_stop_is_done_by_the_next_daemon(
        cubie_daemon: Any, docker_client: Any, tmp_path: Path, det_inputs: dict[str, Any]) -> None:  # noqa: F811
    """The crash-limit reap waits for a hung engine; the daemon is stopped meanwhile: the next daemon, on an engine
    that answers, still kills the abandoned step (the reap list lived only in the stopped daemon's memory)."""
    d, proxy, _ = died_at_the_limit_on_a_hung_engine(cubie_daemon, docker_client, tmp_path, det_inputs)
    assert d.stop() == 0
    proxy.resume()
    d.start()
    wait_for(lambda: "sleep 100000" not in procs(docker_client, d), 30, "the abandoned step killed")


@pytest.mark.docker
def test_an_engine_lacking_the_image_waits_until_every_engine_serving_the_target_was_probed(
        tmp_path: Path, docker_config: Path) -> None:
    """Engine a lacks the cubie image, engine b (not probed yet, e.g. a slower ssh engine at start) has it: a's slot
    must not take cubie jobs (they would fail IMAGE_NOT_FOUND) before b was looked at."""
    have = configmod.load(docker_config)
    (tmp_path / "lack").mkdir()
    lack_path = write_config(tmp_path / "lack", cubie={**yaml.safe_load(docker_config.read_text())["cubie"],
                                                       "image": "saigeedged-standin/not-loaded:none"})
    lack = configmod.load(lack_path)
    a = Engine(EngineSpec("a", None, ("cubie",)), lack)
    b = Engine(EngineSpec("b", "unix:///var/run/docker.sock", ("cubie",)), have)
    store = Store(tmp_path / "db.sqlite")
    monitor = EngineMonitor([a, b], store, lambda name, reason: None, lambda: None, time.monotonic, 120.0)
    monitor.tick("a")  # a's thread answers first (start() runs one thread per engine)
    first = monitor.ready("a", "cubie")
    monitor.tick("b")
    assert not monitor.ready("a", "cubie")  # once b is known to have it
    assert not first, "a took cubie jobs before b was probed: they fail IMAGE_NOT_FOUND"


def job(attempt: int) -> Job:
    return Job(job_id="j-1", name="j", target="cubie", task="detection", entry={}, subdir="", claim_dir="",
               manifest="j.yml", attempt=attempt)


def test_a_later_attempt_of_a_job_with_a_legacy_folder_gets_a_folder_of_its_own(tmp_path: Path) -> None:
    """An attempt given up on in a pre-upgrade folder (work/<job>/.steps kept for its reap): the next attempt works
    in work/<job>/attempt2, not in the folder whose step may still run and whose .steps/1.exec it would re-attach to."""
    root = tmp_path / "work"
    (root / "j-1" / ".steps").mkdir(parents=True)
    (root / "j-1" / ".steps" / "1.exec").write_text("old")
    assert work_dir(root, job(1)) == root / "j-1"  # the legacy attempt itself, re-attached after the upgrade
    assert fresh_work_dir(root, job(2)) == root / "j-1" / "attempt2"  # the next one starts in a folder of its own
    assert work_dir(root, job(2)) == root / "j-1" / "attempt2" and (root / "j-1" / ".steps" / "1.exec").is_file()


def test_removing_a_legacy_work_folder_keeps_the_work_root(tmp_path: Path) -> None:
    """The work root is bind-mounted into the local containers: removing the last (legacy) job folder must not
    remove the work root itself (a recreated one is not the directory the container sees)."""
    root = tmp_path / "work"
    (root / "j-1" / ".steps").mkdir(parents=True)
    remove_work(work_dir(root, job(1)))
    assert root.is_dir()


@pytest.mark.docker
def test_the_local_container_sees_the_next_job_after_a_legacy_attempt_ended(docker_config: Path) -> None:
    """A legacy (pre-upgrade) attempt, the last folder under the work root, ends: the running container still sees
    the next job's work folder (it does not if the work root was removed and made again under its bind mount)."""
    config = configmod.load(docker_config)
    engine = Engine(EngineSpec("local", None, ("cubie",)), config)
    container = engine.container("cubie")
    config.work_root.mkdir(parents=True, exist_ok=True)
    container.ensure()
    (config.work_root / "j-1" / ".steps").mkdir(parents=True)  # a job re-attached after an upgrade, its last one
    remove_work(work_dir(config.work_root, job(1)))  # what the worker does when that legacy attempt ends
    (config.work_root / "next").mkdir(parents=True)
    (config.work_root / "next" / "f").write_text("x")
    code, out = answered(lambda: container.probe(f"test -f {config.work_root}/next/f && echo seen"))
    assert "seen" in out, (code, out)

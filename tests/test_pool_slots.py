"""Pool slots (SPEC §11): a queued job is taken by exactly one slot, and an attempt requeued under a worker stuck
on its engine (the engine watch's ENGINE_LOST) never publishes nor records anything afterwards."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_config
from engineproxy import EngineProxy
from factory import random_labels, valjson, yolox
from harness import release_standin, wait_for, wait_for_quantize

from saigeedged import config as configmod
from saigeedged import jobid
from saigeedged import manifest as manifestmod
from saigeedged.adapters.docker import Containers, Engine
from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import Store
from saigeedged.engines import DEFAULT, EngineSpec
from saigeedged.jobs import Job, entry_to_doc
from saigeedged.service.lifecycle import Jobs, Places
from saigeedged.service.slot import Slot
from saigeedged.service.worker import Worker


def setup(config: configmod.Config) -> tuple[Jobs, Places]:
    places = Places(config.inbox, config.state_dir)
    for folder in (config.inbox, config.outbox, places.claimed):
        folder.mkdir(parents=True, exist_ok=True)
    return Jobs(Store(config.state_dir / "saigeedged.db"), Outbox(config.outbox), places), places


def queued_job(tmp_path: Path, config: configmod.Config, jobs: Jobs, name: str) -> Job:
    """A cubie job row as a claim makes it, its inputs under claimed/ (a tiny YOLOX and four calibration images)."""
    folder = jobs.places.claimed / name
    folder.mkdir(parents=True)
    yolox(folder / f"{name}.onnx", size=(64, 64))
    calib = valjson(tmp_path / "data", random_labels(8, 3))
    (folder / f"{name}.yml").write_text(yaml.safe_dump({"task": "detection", "num_classes": 3, "calib": str(calib),
                                                        "n_samples": 4, "target": "cubie"}))
    (entry,) = manifestmod.load(folder / f"{name}.yml", config.defaults.as_dict(), drop=True)
    now = jobid.iso(jobid.utc_now())
    job = Job(job_id=f"{name}-1", name=name, target="cubie", task=entry.task, entry=entry_to_doc(entry), subdir="",
              claim_dir=str(folder), manifest=f"{name}.yml", created_at=now, updated_at=now)
    jobs.add(job)
    return job


def worker(config: configmod.Config, jobs: Jobs, places: Places, engine: str, **slot: Any) -> Worker:
    spec = DEFAULT if engine == "local" else EngineSpec(engine, None, ("cubie",))
    containers = Containers(config, engine=Engine(spec, config))
    return Worker(config, jobs, containers, places, slot=Slot(engine, ("cubie",), True, **slot))


def test_a_queued_job_is_taken_by_one_slot_only(tmp_path: Path) -> None:
    """Slots of two engines that both saw the same queued job: one conditional write wins, the other takes nothing."""
    config = configmod.load(write_config(tmp_path))
    jobs, places = setup(config)
    job = queued_job(tmp_path, config, jobs, "det")
    workers = [worker(config, jobs, places, name) for name in ("a", "b", "c", "d")]
    seen = [jobs.store.get(job.job_id) for _ in workers]  # each read it queued, before any took it
    barrier = threading.Barrier(len(workers))
    took: dict[str, bool] = {}

    def take(w: Worker, mine: Any) -> None:
        barrier.wait()
        took[w.slot.engine] = w._start(mine)

    threads = [threading.Thread(target=take, args=(w, j)) for w, j in zip(workers, seen, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [name for name, ok in took.items() if ok]
    assert len(winners) == 1
    row = jobs.store.get(job.job_id)
    assert row is not None and row.state == "running" and row.engine == winners[0]
    assert [a["engine"] for a in row.attempts] == winners


@pytest.mark.docker
def test_an_attempt_requeued_under_its_worker_publishes_nothing(tmp_path: Path, docker_config: Path, docker_client: Any,
                                                               fresh_acuity: str, monkeypatch: Any) -> None:
    """The engine watch requeues a job (ENGINE_LOST) while its worker waits on the engine; when the step then
    finishes, that attempt writes no row, status or bundle; the next attempt publishes the one bundle."""
    settings = yaml.safe_load(docker_config.read_text())
    config = configmod.load(write_config(tmp_path, cubie={**settings["cubie"], "image": fresh_acuity},
                                         limits=settings["limits"], allowed_roots=[str(tmp_path / "data")]))
    proxy = EngineProxy(tmp_path / "engine.sock")  # the worker's engine: one that stops answering when told
    proxy.up()
    monkeypatch.setenv("DOCKER_HOST", proxy.docker_host)
    jobs, places = setup(config)
    job = queued_job(tmp_path, config, jobs, "det_untilreleased")
    ready = threading.Event()
    ready.set()
    w = worker(config, jobs, places, "local", ready=lambda target: ready.is_set())
    w.start()
    try:
        wait_for(lambda: (row := jobs.store.get(job.job_id)) and row.step == "quantize", 120, "the quantize step")
        ctr = docker_client.containers.get(settings["cubie"]["container"])
        wait_for_quantize(ctr)
        proxy.hang()  # the follow's next look at the step waits on the engine (engine_timeout_s: minutes)
        wait_for(lambda: w.containers.active is not None and w.containers.active.calls, 30, "the worker in a call")
        ready.clear()  # the engine is down for the pool: this slot takes nothing
        assert w.lose("does not answer", lambda target: True)  # another engine serves cubie: the job moves
        requeued = jobs.store.get(job.job_id)
        assert requeued is not None and (requeued.state, requeued.attempt) == ("queued", 2)
        proxy.resume()
        release_standin(ctr)  # through the engine itself: the lost attempt's step ends, then the next one's at once
        wait_for(lambda: w.current is None, 60, "the lost attempt's worker to let go")
        row = jobs.store.get(job.job_id)
        assert row is not None and (row.state, row.attempt, row.step) == ("queued", 2, None)
        assert row.error is not None and row.error["code"] == "ENGINE_LOST"
        assert [(a["engine"], a["error"]) for a in row.attempts] == [("local", "ENGINE_LOST")]
        assert not list(config.outbox.rglob("*.saigeedge"))
        assert jobs.outbox.read_status(job.job_id)["state"] == "queued"  # type: ignore[index]
        ready.set()
        w.wake.set()
        wait_for(lambda: (row := jobs.store.get(job.job_id)) and row.state == "succeeded", 120, "the next attempt")
        assert len(list(config.outbox.rglob("*.saigeedge"))) == 1
    finally:
        proxy.resume()
        w.stop()
        w.join(30)
        proxy.down()


def test_a_stop_asked_just_before_a_take_stops_the_job_before_its_first_step(tmp_path: Path) -> None:
    """SIGTERM landing between a worker's look at the queue and its take: the take does not erase the stop, so the
    job runs no step (not even validate) and goes back to the queue, its inputs still claimed."""
    config = configmod.load(write_config(tmp_path, allowed_roots=[str(tmp_path / "data")]))
    jobs, places = setup(config)
    job = queued_job(tmp_path, config, jobs, "stopped")
    w = worker(config, jobs, places, "local")
    w.stop_event.set()  # the stop arrives after next_queued() returned the job, before execute() takes it
    w.execute(job)
    after = jobs.store.get(job.job_id)
    assert after is not None and (after.state, after.step) == ("queued", None), after
    assert [(a["error"], a.get("stopped")) for a in after.attempts] == [(None, True)]  # a stop, no cancel
    assert "before step validate (stop)" in places.local_log(job.job_id).read_text()
    assert Path(after.entry["onnx"]).is_file()


def test_a_cancel_is_the_workers_word_and_the_stores_never_undone_by_a_stop(tmp_path: Path) -> None:
    """What the containers' steps end by (the worker's `interrupted`): a cancel the store holds counts at once (a job
    re-attached after a restart, before the main loop passes it on), and a stop after a cancel does not turn it into
    a detach (`saigeedged cancel X && systemctl restart saigeedged` ends X cancelled)."""
    config = configmod.load(write_config(tmp_path, allowed_roots=[str(tmp_path / "data")]))
    jobs, places = setup(config)
    job = queued_job(tmp_path, config, jobs, "cancelled")
    w = worker(config, jobs, places, "local")
    taken = jobs.take(job.job_id, "local", str(tmp_path / "work"))
    assert taken is not None
    w.current = taken
    assert w.containers.interrupted() is None
    assert jobs.store.request_cancel(job.job_id)
    assert w.containers.interrupted() == "cancel"  # the store's, the main loop not there yet
    w.interrupt("cancel")
    w.interrupt("stop")
    assert w.containers.interrupted() == "cancel"


class Stage:
    """A finishing stage that takes every job handed to it, or (full) none."""

    def __init__(self, room: bool) -> None:
        self.room, self.jobs = room, list[Job]()

    def hand(self, job: Job, compiled: Any, container: Any = None, taken: Any = lambda: None) -> bool:
        if self.room:
            taken()
            self.jobs.append(job)
        return self.room


def test_the_row_says_whether_a_job_was_handed_to_the_finishing_stage(tmp_path: Path) -> None:
    """A worker records the hand-over in the job's row before the finishing stage can take the job (`status` and the
    dashboard go by it, not by the step: a handed job waiting for a finisher is still in `export`); one the stage
    refuses (its backlog full) stays its worker's, which bundles and publishes it: the row says so again."""
    from saigeedged.compile import pipeline

    config = configmod.load(write_config(tmp_path))
    jobs, places = setup(config)
    for name, room in (("handed", True), ("kept", False)):
        jobs.add(Job(job_id=f"{name}-1", name=name, target="cubie", task="detection", entry={"onnx": "/x.onnx"},
                     subdir="", claim_dir="/c", manifest=f"{name}.yml", created_at="t"))
        w = Worker(config, jobs, Containers(config), places)
        w.finisher = stage = Stage(room)
        taken = jobs.take(f"{name}-1", "local")
        assert taken is not None and not taken.finishing
        w._own(taken)
        taken.step, taken.step_index, taken.step_count = "export", 9, 11
        assert w._hand_off(taken, pipeline.Compiled(None, None, [])) is room  # type: ignore[arg-type]
        row = jobs.store.get(f"{name}-1")
        assert row is not None and row.finishing is room and w.handed_off is room
        assert stage.jobs == ([taken] if room else []) and taken.finishing is room  # a finisher's writes keep it

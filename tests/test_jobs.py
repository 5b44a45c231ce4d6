"""Ending a job: whoever reads its final status file finds the log in the outbox and the inputs settled."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import Store
from saigeedged.errors import SaigeError
from saigeedged.jobs import FAILED, QUEUED, RUNNING, SUCCEEDED, TERMINAL, Job
from saigeedged.service.lifecycle import Jobs, Places


class WatchedOutbox(Outbox):
    """A real outbox that notes what `look()` sees each time a terminal status file is written."""

    def __init__(self, root: Path, look: Callable[[Job], Any]) -> None:
        super().__init__(root)
        self.look, self.seen = look, []  # type: ignore[var-annotated]

    def write_status(self, job: Job) -> None:
        if job.state in TERMINAL:
            self.seen.append((job.job_id, job.state, self.look(job)))
        super().write_status(job)


def queued(job_id: str, claim: Path) -> Job:
    return Job(job_id=job_id, name=job_id, target="host", task="mlc", entry={"onnx": str(claim / f"{job_id}.onnx")},
               subdir="", claim_dir=str(claim), manifest="m.yml", created_at="t")


def running(store: Store, places: Places, job_id: str, claim: Path) -> Job:
    claim.mkdir(parents=True, exist_ok=True)
    (claim / f"{job_id}.onnx").write_bytes(b"onnx")
    job = queued(job_id, claim)
    store.add(job)
    job.state = RUNNING
    store.save(job)
    places.logs.mkdir(parents=True, exist_ok=True)
    places.local_log(job_id).write_text(f"{job_id} log\n")
    return job


def where(places: Places, outbox: Path) -> Callable[[Job], Any]:
    def look(job: Job) -> Any:
        folder = Path(job.claim_dir).name
        return {"claimed": (places.claimed / folder).exists(), "failed": (places.failed / folder).exists(),
                "log_out": (outbox / "logs" / f"{job.job_id}.log").is_file(),
                "log_local": places.local_log(job.job_id).exists()}
    return look


@pytest.fixture()
def setup(tmp_path: Path) -> tuple[Jobs, Places, WatchedOutbox]:
    places = Places(tmp_path / "inbox", tmp_path / "state")
    outbox = WatchedOutbox(tmp_path / "outbox", where(places, tmp_path / "outbox"))
    return Jobs(Store(tmp_path / "q.db"), outbox, places), places, outbox


def test_succeeded_is_written_after_the_inputs_are_deleted(setup: tuple[Jobs, Places, WatchedOutbox]) -> None:
    """The status file says succeeded only once the claimed folder is gone, the log is in the outbox and the
    journal has the job.succeeded event."""
    jobs, places, outbox = setup
    job = running(jobs.store, places, "a-1", places.claimed / "a-1")
    with structlog.testing.capture_logs() as logged:
        look = outbox.look
        outbox.look = lambda j: {**look(j), "events": [e["event"] for e in logged]}
        jobs.end(job, SUCCEEDED)
    assert outbox.seen == [("a-1", SUCCEEDED, {"claimed": False, "failed": False, "log_out": True, "log_local": False,
                                               "events": ["job.succeeded"]})]
    assert outbox.read_status("a-1")["state"] == SUCCEEDED


def test_the_last_entry_of_a_drop_settles_the_shared_folder(setup: tuple[Jobs, Places, WatchedOutbox]) -> None:
    """Two entries share a claimed folder: the first to end leaves it; the last one's failed status finds it in failed/."""
    jobs, places, outbox = setup
    shared = places.claimed / "a-1"
    first, second = running(jobs.store, places, "a-1", shared), running(jobs.store, places, "b-2", shared)
    jobs.end(first, SUCCEEDED)
    jobs.end(second, FAILED, SaigeError("STEP_FAILED", "boom", step="quantize"))
    assert [(i, s, seen["claimed"], seen["failed"]) for i, s, seen in outbox.seen] == [
        ("a-1", SUCCEEDED, True, False), ("b-2", FAILED, False, True)]
    stored = jobs.store.get("b-2")
    assert stored.claim_dir == str(places.failed / "a-1") and stored.entry["onnx"].startswith(str(places.failed))
    assert outbox.read_status("b-2")["error"]["code"] == "STEP_FAILED"


def test_inputs_that_cannot_move_do_not_hide_the_end(setup: tuple[Jobs, Places, WatchedOutbox]) -> None:
    """If the claimed folder cannot be moved to failed/, the failed status is still written and the daemon goes on."""
    jobs, places, outbox = setup
    job = running(jobs.store, places, "a-1", places.claimed / "a-1")
    places.failed.mkdir(parents=True)
    (places.failed / "a-1").write_text("in the way")  # rename of a folder onto a file fails
    jobs.end(job, FAILED, SaigeError("STEP_FAILED", "boom"))
    assert outbox.read_status("a-1")["state"] == FAILED
    assert (places.claimed / "a-1" / "a-1.onnx").is_file()  # nothing lost


def test_a_job_taken_at_once_is_not_shown_queued_again(tmp_path: Path) -> None:
    """The worker may start a job the moment its row exists: the claim's `queued` status file never lands on top
    of the worker's `running` (nor turns the row back to queued)."""
    places = Places(tmp_path / "inbox", tmp_path / "state")
    outbox = Outbox(tmp_path / "outbox")
    taken = threading.Event()

    class EagerWorkerStore(Store):
        def add(self, job: Job) -> None:
            super().add(job)
            threading.Thread(target=start, args=(job.job_id,)).start()
            taken.wait(0.5)  # bounded: with the status written under the row's lock the worker cannot finish first

    def start(job_id: str) -> None:
        job = jobs.store.get(job_id)
        job.state = RUNNING
        jobs.save(job, expect=QUEUED)
        taken.set()

    jobs = Jobs(EagerWorkerStore(tmp_path / "q.db"), outbox, places)
    jobs.add(queued("a-1", places.claimed / "a-1"))
    assert taken.wait(10)
    assert outbox.read_status("a-1")["state"] == RUNNING and jobs.store.get("a-1").state == RUNNING

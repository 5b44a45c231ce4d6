"""The store as the arbiter (SPEC §15): one atomic take, writes fenced by the attempt, a cancel that beats a requeue."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from saigeedged.adapters.outbox import Outbox
from saigeedged.adapters.store import Store
from saigeedged.errors import SaigeError
from saigeedged.jobs import CANCELLED, QUEUED, RUNNING, SUCCEEDED, Attempt, Job, Superseded
from saigeedged.service.lifecycle import Jobs, Places


def job(job_id: str = "a-1", target: str = "cubie") -> Job:
    return Job(job_id=job_id, name=job_id.split("-")[0], target=target, task="mlc", entry={"onnx": "/x.onnx"},
               subdir="", claim_dir=f"/c/{job_id}", manifest="x.yml", created_at="t")


def lifecycle(tmp_path: Path) -> Jobs:
    places = Places(tmp_path / "inbox", tmp_path / "state")
    places.make(tmp_path / "outbox")
    return Jobs(Store(tmp_path / "state" / "q.db"), Outbox(tmp_path / "outbox"), places)


def test_one_of_many_takers_gets_the_job(tmp_path: Path) -> None:
    """Eight threads, each with a connection of its own, take one queued job at once: exactly one gets it, running."""
    Store(tmp_path / "q.db").add(job())
    stores = [Store(tmp_path / "q.db") for _ in range(8)]
    start, results = threading.Barrier(len(stores)), []

    def take(store: Store, n: int) -> None:
        start.wait()
        results.append(store.take("a-1", f"e{n}", "2026-12-01T00:00:00Z"))

    threads = [threading.Thread(target=take, args=(store, n)) for n, store in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    taken = [j for j in results if j is not None]
    assert len(taken) == 1 and len(results) == 8
    stored = stores[0].get("a-1")
    assert stored is not None and stored.state == RUNNING and len(stored.attempts) == 1
    assert stored.attempts[0]["engine"] == taken[0].attempts[0]["engine"] == taken[0].engine


def test_take_opens_the_attempt_and_refuses_what_is_not_queued(tmp_path: Path) -> None:
    """take: started_at and an open attempt on the engine; a running or a cancelled job is not taken."""
    store = Store(tmp_path / "q.db")
    store.add(job())
    taken = store.take("a-1", "local", "2026-12-01T00:00:00Z")
    assert taken is not None and taken.started_at == "2026-12-01T00:00:00Z" and taken.engine == "local"
    assert taken.attempts == [{"engine": "local", "attempt": 1, "started_at": "2026-12-01T00:00:00Z", "finished_at": None,
                               "error": None}]
    assert store.take("a-1", "other", "2026-12-01T00:00:01Z") is None
    store.add(job("b-2"))
    stale = store.get("b-2")
    assert stale is not None
    stale.state = CANCELLED
    store.save(stale)
    assert store.take("b-2", "local", "2026-12-01T00:00:02Z") is None
    assert store.take("missing-3", "local", "2026-12-01T00:00:02Z") is None


def taken_then_requeued(store: Store, spend: int) -> tuple[Job, Attempt]:
    """A job taken on e1, then requeued by someone else (its attempt number + `spend`): the first run and its fence."""
    store.add(job())
    first = store.take("a-1", "e1", "t1")
    assert first is not None
    requeued = store.get("a-1")
    assert requeued is not None
    requeued.state, requeued.attempt = QUEUED, requeued.attempt + spend
    store.save(requeued)
    return first, Attempt.of(first)


def test_a_requeued_attempt_can_no_longer_write(tmp_path: Path) -> None:
    """A fenced save of an attempt requeued meanwhile raises Superseded and leaves the new attempt's row alone."""
    store = Store(tmp_path / "q.db")
    store.add(job("b-2"))
    running = store.take("b-2", "e1", "t1")
    assert running is not None
    running.step = "quantize"
    store.save(running, fence=Attempt.of(running))  # still current: it lands
    first, old = taken_then_requeued(store, 1)
    second = store.take("a-1", "e2", "t2")
    assert second is not None and not store.still_current(old) and store.still_current(Attempt.of(second))
    first.state = SUCCEEDED
    with pytest.raises(Superseded):
        store.save(first, fence=old)
    stored = store.get("a-1")
    assert stored is not None and stored.state == RUNNING and stored.engine == "e2"


def test_a_hold_on_the_same_engine_is_still_a_new_attempt(tmp_path: Path) -> None:
    """Requeued unspent (engine unreachable) and taken again on the same engine: the old run is fenced off."""
    store = Store(tmp_path / "q.db")
    first, old = taken_then_requeued(store, 0)
    second = store.take("a-1", "e1", "t2")
    assert second is not None and second.attempt == first.attempt
    with pytest.raises(Superseded):
        store.save(first, fence=old)


def test_jobs_fenced_end_writes_no_status_for_a_stale_attempt(tmp_path: Path) -> None:
    """Jobs.end with the fence of a superseded attempt raises and writes neither the row nor the status file."""
    jobs = lifecycle(tmp_path)
    jobs.add(job())
    first = jobs.take("a-1", "e1")
    assert first is not None and jobs.outbox.read_status("a-1")["state"] == RUNNING  # type: ignore[index]
    old = Attempt.of(first)
    jobs.requeue(first, "engine_lost", SaigeError("ENGINE_LOST", "gone"), fence=old)
    second = jobs.take("a-1", "e2")
    assert second is not None
    first.state = RUNNING
    with pytest.raises(Superseded):
        jobs.end(first, SUCCEEDED, fence=old)
    status = jobs.outbox.read_status("a-1")
    assert status is not None and status["state"] == RUNNING and status["engine"] == "e2"
    jobs.end(second, SUCCEEDED, fence=Attempt.of(second))
    status = jobs.outbox.read_status("a-1")
    assert status is not None and status["state"] == SUCCEEDED


def test_holding_keeps_a_requeue_out_until_the_publish_is_done(tmp_path: Path) -> None:
    """A requeue from another thread waits while an attempt holds its job; the stale holder is then refused."""
    jobs = lifecycle(tmp_path)
    jobs.add(job())
    taken = jobs.take("a-1", "e1")
    assert taken is not None
    attempt, order = Attempt.of(taken), []
    inside = threading.Event()

    def requeue() -> None:
        inside.wait()
        copy = jobs.store.get("a-1")
        assert copy is not None
        jobs.requeue(copy, "engine_lost", fence=attempt)
        order.append("requeued")

    thread = threading.Thread(target=requeue)
    thread.start()
    with jobs.holding(attempt):
        inside.set()
        thread.join(0.2)  # time enough for an unblocked requeue to finish
        assert thread.is_alive()  # it waits for the holder
        order.append("published")
        assert jobs.still_current(attempt)
    thread.join()
    assert order == ["published", "requeued"] and not jobs.still_current(attempt)
    with pytest.raises(Superseded), jobs.holding(attempt):
        pass


def test_a_cancel_wins_over_a_requeue(tmp_path: Path) -> None:
    """A running job flagged by `saigeedged cancel` and then requeued (stop, ENGINE_LOST) ends cancelled."""
    jobs = lifecycle(tmp_path)
    jobs.add(job())
    taken = jobs.take("a-1", "e1")
    assert taken is not None
    taken.step = "quantize"
    assert jobs.store.request_cancel("a-1")
    jobs.requeue(taken, "stop", SaigeError("CANCELLED", "stopping", reason="stop"), fence=Attempt.of(taken))
    stored = jobs.store.get("a-1")
    assert stored is not None and stored.state == CANCELLED and stored.attempt == 1
    assert stored.error is not None and stored.error["code"] == "CANCELLED" and stored.error["step"] == "quantize"
    assert [(a["error"], a["finished_at"] is not None) for a in stored.attempts] == [("CANCELLED", True)]  # not open
    assert jobs.outbox.read_status("a-1")["state"] == CANCELLED  # type: ignore[index]
    assert jobs.store.take("a-1", "e1", "t") is None


def test_a_cancel_flag_only_sticks_to_a_running_job(tmp_path: Path) -> None:
    """request_cancel of a queued or ended job is refused, so a queued row can always be taken."""
    store = Store(tmp_path / "q.db")
    store.add(job())
    assert not store.request_cancel("a-1") and not store.cancel_requested("a-1")
    assert store.take("a-1", "e1", "t") is not None


def test_cancel_of_a_job_racing_between_states_prints_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`saigeedged cancel` while a daemon-like thread keeps taking and requeueing the job: one line, exit 0, and the
    job ends cancelled (the cancel is neither a traceback nor lost to a requeue)."""
    from conftest import write_config

    from saigeedged.cli import main as cli

    config = write_config(tmp_path)
    jobs = lifecycle(tmp_path)
    jobs.store = Store(tmp_path / "state" / "saigeedged.db")
    jobs.add(job())
    stop = threading.Event()

    def flip() -> None:  # a slot that takes the job and an engine that keeps losing it
        while not stop.is_set():
            taken = jobs.take("a-1", "e1")
            if taken is not None:
                jobs.requeue(taken, "engine_lost", spend_attempt=False, fence=Attempt.of(taken))
            elif jobs.store.get("a-1").state == CANCELLED:  # type: ignore[union-attr]
                return

    thread = threading.Thread(target=flip)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two statements: the race is met, not hoped for
    thread.start()
    try:
        rc = cli.main(["cancel", "a-1", "-c", str(config)])
        thread.join(30)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)
    out = capsys.readouterr()
    said = [line for line in out.out.splitlines() if line.startswith("a-1")]  # the rest: the flipper's journal events
    assert rc == 0 and len(said) == 1 and "Traceback" not in out.out + out.err
    stored = jobs.store.get("a-1")
    assert stored is not None and stored.state == CANCELLED


def test_a_requeue_ends_the_attempt_still_open(tmp_path: Path) -> None:
    """A job requeued with its attempt open (a restart's requeue: the daemon died under it; an engine lost) has that
    attempt ended, with the requeue's error code or INTERNAL: `status` and the status file showed a queued job's
    attempt running "since" until a slot took it again."""
    jobs = lifecycle(tmp_path)
    for job_id, error in (("a-1", None), ("b-2", SaigeError("ENGINE_LOST", "gone"))):
        jobs.add(job(job_id))
        taken = jobs.take(job_id, "e1")
        assert taken is not None
        jobs.requeue(taken, "restart" if error is None else "engine_lost", error)
        stored = jobs.store.get(job_id)
        assert stored is not None and stored.state == QUEUED and stored.attempt == 2
        (ended,) = stored.attempts
        assert ended["finished_at"] == stored.updated_at and ended["error"] == (error.code if error else "INTERNAL")
        assert jobs.outbox.read_status(job_id)["attempts"] == stored.attempts  # type: ignore[index]


def test_a_refused_requeue_leaves_the_job_as_it_was(tmp_path: Path) -> None:
    """A requeue the store refuses (a stale attempt) raises and leaves the caller's job unchanged: no attempt spent."""
    jobs = lifecycle(tmp_path)
    jobs.add(job())
    first = jobs.take("a-1", "e1")
    assert first is not None
    stale = Attempt.of(first)
    jobs.requeue(jobs.store.get("a-1"), "engine_lost", fence=stale)  # type: ignore[arg-type]
    assert jobs.take("a-1", "e2") is not None
    first.step = "quantize"
    with pytest.raises(Superseded):
        jobs.requeue(first, "stop", fence=stale)
    assert (first.state, first.attempt, first.step) == (RUNNING, 1, "quantize")
    assert first.attempts[-1]["finished_at"] is None  # its attempt still open, as it was

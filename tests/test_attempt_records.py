"""Attempt facts belong to the store (SPEC §15, issue 26): one versioned JSON record per attempt, no pickle, a stop
never counted as a crash, reaps on the engine the attempt ran on, and the worker's settlement as a pure table."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import write_config
from test_store_fence import job, lifecycle

from saigeedged import config as configmod
from saigeedged.adapters.joblog import JobLog
from saigeedged.adapters.store import Store
from saigeedged.compile import ahead, child, resume
from saigeedged.compile.inputs import PathPolicy
from saigeedged.errors import SaigeError
from saigeedged.jobs import CANCELLED, FAILED, Attempt, Job, Superseded, remaining_s, spent
from saigeedged.manifest import load as load_manifest
from saigeedged.records import AttemptRecord, UnreadableRecord
from saigeedged.service.decision import DETACH, END, HOLD, REQUEUE, Decision, decide
from saigeedged.service.monitor import EngineMonitor
from saigeedged.service.recovery import Recovery

PACKAGE = Path(__file__).parent.parent / "saigeedged"


def test_no_module_of_the_package_uses_pickle() -> None:
    """Nothing the daemon reads back is unpickled: `pickle` appears nowhere in the package's source."""
    found = subprocess.run(["grep", "-rln", "--include=*.py", "pickle", str(PACKAGE)], capture_output=True,
                           text=True).stdout.split()
    assert found == []


def test_prepared_inputs_round_trip_as_versioned_json(tmp_path: Path, det_inputs: dict[str, Any]) -> None:
    """Real host steps' results become plain JSON and come back equal, so a resume needs no class of any version."""
    folder = tmp_path / "claimed"
    folder.mkdir()
    (folder / "det.onnx").write_bytes(det_inputs["onnx"].read_bytes())
    (folder / "det.yml").write_text(json.dumps(det_inputs["manifest"]))
    entry = load_manifest(folder / "det.yml", configmod.load(write_config(tmp_path)).section("defaults"), drop=True)[0]
    prep = ahead.host_steps(entry, tmp_path / "work", PathPolicy(None), None)
    doc = json.loads(json.dumps(resume.to_doc(prep)))
    back = resume.from_doc(doc)
    assert resume.to_doc(back) == doc and doc["version"] == resume.VERSION
    assert back.entry == prep.entry and back.info == prep.info and tuple(back.chosen) == tuple(prep.chosen)
    assert back.calib == prep.calib and back.dataset == prep.dataset and resume.usable(doc)
    assert not resume.usable({**doc, "version": resume.VERSION + 1})
    assert not resume.usable({k: v for k, v in doc.items() if k != "info"})


def test_a_record_of_another_version_or_damaged_is_unreadable() -> None:
    """A record written by another version, or one missing a field, is refused (its attempt is requeued), never
    guessed at."""
    record = AttemptRecord("a-1", 1, 1, "local", "cubie", "/w")
    assert AttemptRecord.from_doc(record.to_doc()) == record
    with pytest.raises(UnreadableRecord, match="version 2"):
        AttemptRecord.from_doc({**record.to_doc(), "version": 2})
    with pytest.raises(UnreadableRecord):
        AttemptRecord.from_doc({k: v for k, v in record.to_doc().items() if k != "engine"})
    with pytest.raises(UnreadableRecord):
        AttemptRecord.from_doc({**record.to_doc(), "crashes": "many"})


def test_take_writes_the_attempts_record_with_it(tmp_path: Path) -> None:
    """Taking a job writes its attempt's record in the same transaction; fenced updates of a stale attempt fail."""
    store = Store(tmp_path / "q.db")
    store.add(job())
    taken = store.take("a-1", "local", "2026-12-01T00:00:00Z", "/w/a-1/attempt1")
    assert taken is not None
    record = store.current_record(taken)
    assert record == AttemptRecord("a-1", 1, 1, "local", "cubie", "/w/a-1/attempt1")
    fence = Attempt.of(taken)
    assert store.update_record("a-1", 1, fence, started=True).started
    stale = Attempt("a-1", 1, "local", 0)
    with pytest.raises(Superseded):
        store.update_record("a-1", 1, stale, prepared={"version": 1})


def test_an_ended_jobs_records_keep_only_what_a_reap_needs(tmp_path: Path) -> None:
    """Once a job ends, its attempts' records drop the host steps' results and the steps' book (nothing resumes it),
    and stay readable: a reap still finds its engine and work dir."""
    jobs = lifecycle(tmp_path)
    jobs.add(job())
    taken = jobs.take("a-1", "local", "/w/a-1/attempt1")
    assert taken is not None
    fence = Attempt.of(taken)
    jobs.store.update_record("a-1", 1, fence, started=True, prepared={"version": 1}, steps={"1": {"exec": "e"}})
    jobs.end(taken, CANCELLED, SaigeError("CANCELLED", "cancelled"), fence=fence)
    record = jobs.store.record("a-1", 1)
    assert record is not None and record.prepared is None and record.steps == {}
    assert (record.engine, record.work, record.started) == ("local", "/w/a-1/attempt1", True)


def test_hold_then_move_then_restart_reaps_on_the_engine_the_attempt_ran_on(tmp_path: Path) -> None:
    """Held (requeued unspent), taken again on engine a, moved off it (ENGINE_LOST), then taken on b: the reap of
    the moved attempt names a and its own work dir, read back from the store as a restarted daemon reads it."""
    jobs = lifecycle(tmp_path)
    jobs.add(job())
    first = jobs.take("a-1", "a", "/w/a-1/attempt1")
    assert first is not None
    jobs.requeue(first, "docker_unavailable", spend_attempt=False, fence=Attempt.of(first))  # held: no number spent
    second = jobs.take("a-1", "a", "/w/a-1/attempt1")
    assert second is not None and second.attempt == 1 and len(second.attempts) == 2
    monitor = EngineMonitor([], jobs.store, lambda name, reason: None, lambda: None, lambda: 0.0, 1.0)
    moved = Attempt.of(second)
    jobs.requeue(second, "engine_lost", fence=moved)
    monitor.abandoned([moved])
    third = jobs.take("a-1", "b", "/w/a-1/attempt2")
    assert third is not None and third.attempt == 2
    restarted = Store(tmp_path / "state" / "q.db")
    assert [(r.engine, r.work, r.take) for r in restarted.reaps()] == [("a", "/w/a-1/attempt1", 2)]
    assert restarted.reaps("b") == []


def test_a_stop_never_counts_as_a_crash(tmp_path: Path) -> None:
    """An attempt left detached by each of many stops stays resumable with no crash counted; daemons that die under
    it without a stop are counted, and at limits.max_attempts it is no longer resumed."""
    jobs = lifecycle(tmp_path)
    jobs.add(job())
    taken = jobs.take("a-1", "local", str(tmp_path / "w"))
    assert taken is not None
    recovery = Recovery(jobs, max_attempts=3)
    for _ in range(5):  # five restarts (or package upgrades), each a stop
        jobs.store.update_record("a-1", 1, Attempt.of(taken), detached=True)
        left = recovery.attempt_left(taken, tmp_path / "w")
        assert left.resumable and left.crashes == 0
    left = [recovery.attempt_left(taken, tmp_path / "w") for _ in range(3)]  # three deaths, no stop
    assert [(x.resumable, x.crashes) for x in left] == [(True, 1), (True, 2), (False, 3)]


def test_an_unreadable_record_beside_a_started_step_is_not_resumed_but_reaped(tmp_path: Path) -> None:
    """A record of another version (a downgrade, a damaged row) is not resumed: it is made anew with its reap pending
    on its engine, so the step is killed before the job runs again."""
    jobs = lifecycle(tmp_path)
    jobs.add(job())
    taken = jobs.take("a-1", "local", str(tmp_path / "w"))
    assert taken is not None
    with sqlite3.connect(tmp_path / "state" / "q.db") as db:
        db.execute("UPDATE attempts SET doc = json_set(doc, '$.version', 99)")
    with pytest.raises(UnreadableRecord):
        jobs.store.current_record(taken)
    left = Recovery(jobs, max_attempts=3).attempt_left(taken, tmp_path / "w")
    assert not left.resumable
    record = jobs.store.current_record(taken)
    assert record is not None and record.started and record.work == str(tmp_path / "w")


def test_a_started_step_without_replayable_host_steps_is_not_resumed(tmp_path: Path) -> None:
    """A record that says a step may run but whose host steps' results cannot be replayed (a moved class in the old
    world, a lost dataset here) is not resumed: host steps never run again beside a started step."""
    jobs = lifecycle(tmp_path)
    jobs.add(job())
    taken = jobs.take("a-1", "local", str(tmp_path / "w"))
    assert taken is not None
    jobs.store.update_record("a-1", 1, Attempt.of(taken), started=True, prepared={"version": 1, "entry": {}})
    assert not Recovery(jobs, max_attempts=3).attempt_left(taken, tmp_path / "w").resumable


@pytest.mark.parametrize(("code", "reason", "retryable", "attempt", "started", "expected"), [
    ("CANCELLED", "stop", False, 1, True, Decision(DETACH)),
    ("CANCELLED", "stop", False, 1, False, Decision(REQUEUE, "stop", spend=True)),
    ("CANCELLED", "stop", False, 3, False, Decision(REQUEUE, "stop", spend=True)),  # a new number (jobs.spent)
    ("DOCKER_UNAVAILABLE", None, False, 1, True, Decision(HOLD)),
    ("DOCKER_UNAVAILABLE", None, False, 3, False, Decision(REQUEUE, "docker_unavailable", spend=False)),
    ("CANCELLED", "cancel", False, 1, True, Decision(END, CANCELLED)),
    ("ENGINE_LOST", None, True, 1, True, Decision(REQUEUE, "engine_lost")),
    ("ENGINE_LOST", None, True, 3, True, Decision(END, FAILED)),
    ("CONTAINER_LOST", None, True, 2, True, Decision(REQUEUE, "container_lost", recreate=True)),
    ("CHILD_LOST", None, True, 1, False, Decision(REQUEUE, "child_lost")),
    ("STEP_FAILED", None, False, 1, True, Decision(END, FAILED)),
    ("TIMEOUT", None, False, 1, True, Decision(END, FAILED)),
])
def test_decision_table(code: str, reason: str | None, retryable: bool, attempt: int, started: bool,
                        expected: Decision) -> None:
    """Each way an attempt can end is settled as the table says (limits.max_attempts 3)."""
    assert decide(code, reason, retryable, False, attempt, 3, started) == expected


def test_a_full_state_dir_is_waited_out_never_the_jobs_failure() -> None:
    """An attempt that found state_dir full goes back to the queue unspent, or stays running where a step runs on,
    whatever its attempt number."""
    assert decide("INTERNAL", None, False, False, 3, 3, False, full=True) == Decision(REQUEUE, "state_full", spend=False)
    assert decide("INTERNAL", None, False, False, 3, 3, True, full=True) == Decision(HOLD)


def test_an_exhausted_retryable_error_ends_the_job() -> None:
    """A retryable error that says it is exhausted (publish patience spent) ends the job failed at any attempt."""
    assert decide("PUBLISH_FAILED", None, True, True, 1, 3, False) == Decision(END, FAILED)


def test_the_job_timeout_counts_the_attempts_whole_life() -> None:
    """An attempt re-attached 3 h after it started has 1 h of a 4 h job timeout left, not 4 h again."""
    started = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
    assert remaining_s("2026-12-01T00:00:00.000Z", started + timedelta(hours=3), 4 * 3600) == 3600
    assert remaining_s("2026-12-01T00:00:00.000Z", started + timedelta(hours=5), 4 * 3600) < 0
    assert remaining_s("", started, 60) == 60


def test_a_stale_attempt_cannot_append_to_the_job_log(tmp_path: Path) -> None:
    """The job log is fenced: a write of an attempt the store no longer names raises Superseded and lands nowhere."""
    current = [True]
    log = JobLog(tmp_path / "j.log", lambda: current[0])
    log.line("mine")
    current[0] = False
    with pytest.raises(Superseded):
        log.write(b"stale output\n")
    log.close()
    assert (tmp_path / "j.log").read_text() == "mine\n"


def kill_myself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_host_child_is_a_retryable_loss() -> None:
    """The onnxruntime child killed with SIGKILL (no memory bound asked) is CHILD_LOST, retryable, not INTERNAL."""
    with pytest.raises(SaigeError) as raised:
        child.run(kill_myself, (), "quantize", 60, lambda: None)
    assert raised.value.code == "CHILD_LOST" and raised.value.retryable and "-9" in raised.value.message


def test_a_bug_in_a_stale_attempt_does_not_fail_the_jobs_next_attempt(tmp_path: Path) -> None:
    """The worker's guard for a bug (`Jobs.abandon`) writes under the attempt's fence: a stale attempt whose job was moved
    and taken again leaves the new attempt running, while a bug in the current attempt ends it failed INTERNAL."""
    from saigeedged.adapters.docker import Containers
    from saigeedged.service.worker import Worker

    config = configmod.load(write_config(tmp_path))
    jobs = lifecycle(tmp_path)
    worker = Worker(config, jobs, Containers(config), jobs.places)
    jobs.add(job())
    stale = jobs.take("a-1", "a", "/w/a-1/attempt1")
    assert stale is not None
    worker.attempt = Attempt.of(stale)
    jobs.requeue(stale, "engine_lost", SaigeError("ENGINE_LOST", "moved"), fence=Attempt.of(stale))
    again = jobs.take("a-1", "b", "/w/a-1/attempt2")
    assert again is not None
    jobs.abandon(stale, RuntimeError("a bug"), worker.attempt)
    assert jobs.store.get("a-1").state == "running"  # type: ignore[union-attr]
    worker.attempt = Attempt.of(again)
    jobs.abandon(again, RuntimeError("a bug"), worker.attempt)
    ended = jobs.store.get("a-1")
    assert ended is not None and ended.state == FAILED and ended.error is not None
    assert ended.error["code"] == "INTERNAL"


def test_a_queued_job_cancelled_by_the_cli_gets_its_log_and_journal_event_while_status_files_are_refused(
        tmp_path: Path) -> None:
    """`saigeedged cancel` of a queued job (the operator's shell has no journal) while the outbox refuses status files:
    the daemon's catch-up still moves its log to the outbox and says job.cancelled, without waiting for the status
    folder; the status file follows once the folder takes files again."""
    import structlog

    jobs = lifecycle(tmp_path)
    jobs.add(job())
    ran = jobs.take("a-1", "local", "/w/a-1/attempt1")
    assert ran is not None
    jobs.places.local_log("a-1").parent.mkdir(parents=True, exist_ok=True)
    jobs.places.local_log("a-1").write_text("attempt 1's output\n")
    jobs.requeue(ran, "engine_lost", SaigeError("ENGINE_LOST", "moved"), fence=Attempt.of(ran))
    status = tmp_path / "outbox" / "status"
    status.rename(tmp_path / "outbox" / "status.aside")
    status.write_text("not a folder")  # refuses files even to root, as chmod 000 does to the service user
    queued = jobs.store.get("a-1")
    assert queued is not None
    jobs.end(queued, CANCELLED, SaigeError("CANCELLED", "cancelled while queued"), expect="queued", announce=False)
    with structlog.testing.capture_logs() as logged:
        jobs.catch_up()  # the daemon's round
    assert (tmp_path / "outbox" / "logs" / "a-1.log").read_text() == "attempt 1's output\n"
    assert [(e["event"], e.get("job_id")) for e in logged if e["event"] == "job.cancelled"] == [("job.cancelled", "a-1")]
    status.unlink()
    (tmp_path / "outbox" / "status.aside").rename(status)
    jobs.catch_up()
    assert jobs.outbox.read_status("a-1")["state"] == CANCELLED  # type: ignore[index]
    assert not jobs.behind()


def test_a_host_job_with_an_unreadable_record_is_requeued_by_a_stop_never_detached(tmp_path: Path) -> None:
    """An unreadable attempt record means a container step may run on (SPEC §15: never run twice): a cubie job stopped
    so is left running, detached, for the next start. A host job runs no container step: it goes back to the queue
    (before, it was detached too; in the finishing stage, held for a slot that serves no host job and failed INTERNAL)."""
    from saigeedged.adapters.docker import Containers
    from saigeedged.service.worker import Worker

    config = configmod.load(write_config(tmp_path))
    jobs = lifecycle(tmp_path)
    worker = Worker(config, jobs, Containers(config), jobs.places)
    states = {}
    for target in ("cubie", "host"):
        jobs.add(job(f"{target}-1", target))
        taken = jobs.take(f"{target}-1", "local", f"/w/{target}-1/attempt1")
        assert taken is not None
        with sqlite3.connect(tmp_path / "state" / "q.db") as db:
            db.execute("UPDATE attempts SET doc = json_set(doc, '$.version', 99) WHERE job_id = ?", (taken.job_id,))
        worker.attempt = Attempt.of(taken)
        worker._settle(taken, SaigeError("CANCELLED", "the daemon is stopping", reason="stop"))
        stored = jobs.store.get(taken.job_id)
        assert stored is not None
        states[target] = stored.state
    assert states == {"cubie": "running", "host": "queued"}


def test_each_stop_numbers_the_next_attempt_anew_and_spends_none_of_the_jobs_retries(tmp_path: Path) -> None:
    """A host job stopped five times during its report (the finishing stage settles it as a stop) is requeued as
    attempt + 1 each time (SPEC §8): its attempts are numbered 1 to 6 (they read 1, 2, 3, 3, 3, 3 under max_attempts
    3), and since stops spend none of its retries a CHILD_LOST after them is still retried."""
    from saigeedged.adapters.docker import Containers
    from saigeedged.service.worker import Worker

    config = configmod.load(write_config(tmp_path))
    assert config.limits.max_attempts == 3
    jobs = lifecycle(tmp_path)
    worker = Worker(config, jobs, Containers(config), jobs.places)
    jobs.add(job("host-1", "host"))
    for take in range(1, 7):
        taken = jobs.take("host-1", "local", f"/w/host-1/attempt{take}")
        assert taken is not None
        worker.attempt = Attempt.of(taken)
        worker._settle(taken, SaigeError("CANCELLED", "the daemon stopped before its report was made", reason="stop",
                                         step="bundle") if take < 6 else SaigeError("CHILD_LOST", "report died"))
    stored = jobs.store.get("host-1")
    assert stored is not None
    assert [a["attempt"] for a in stored.attempts] == [1, 2, 3, 4, 5, 6], stored.attempts
    assert [bool(a.get("stopped")) for a in stored.attempts] == [True] * 5 + [False]
    assert (stored.state, stored.attempt) == ("queued", 7)


def test_a_cancel_of_a_held_job_keeps_no_work_dir_of_the_job_its_worker_runs(tmp_path: Path) -> None:
    """`saigeedged cancel` of a job held for its engine (its step may run on: its work dir stays for the monitor's reap)
    is settled from the main loop's thread: the job the worker runs meanwhile keeps its own fate (before, its work dir
    was kept too, until the next start), and a cancel of the job the worker runs, stuck in an engine call, keeps it."""
    from saigeedged.adapters.docker import Containers
    from saigeedged.service import worker as workermod

    config = configmod.load(write_config(tmp_path))
    jobs = lifecycle(tmp_path)
    worker = workermod.Worker(config, jobs, Containers(config), jobs.places)
    for job_id in ("held-1", "runs-1"):
        jobs.add(job(job_id))
        assert jobs.take(job_id, "local", f"/w/{job_id}/attempt1") is not None
    with sqlite3.connect(tmp_path / "state" / "q.db") as db:  # unreadable: its step may run on
        db.execute("UPDATE attempts SET doc = json_set(doc, '$.version', 99) WHERE job_id = 'held-1'")
    held, runs = jobs.store.get("held-1"), jobs.store.get("runs-1")
    assert held is not None and runs is not None
    worker.adopt(held)
    worker._own(runs)
    assert worker.cancel("held-1") == [Attempt.of(held)]
    assert jobs.store.get("held-1").state == CANCELLED  # type: ignore[union-attr]
    assert not worker.kept

    class Stuck:  # the worker's engine call that does not return
        def busy_s(self) -> float:
            return workermod.CANCEL_GRACE_S + 1

    worker.containers.active = Stuck()  # type: ignore[assignment]
    with sqlite3.connect(tmp_path / "state" / "q.db") as db:
        db.execute("UPDATE attempts SET doc = json_set(doc, '$.version', 99) WHERE job_id = 'runs-1'")
    assert worker.cancel("runs-1") == [Attempt.of(runs)]
    assert jobs.store.get("runs-1").state == CANCELLED and worker.kept  # type: ignore[union-attr]


def test_a_job_recorded_before_counts_each_stopped_number_once() -> None:
    """A job the previous release recorded with two stops at its last number (1, 2, 3 stopped, 3 stopped, 3) has
    spent two of its attempts, not one: a stopped number is one stop, however many runs it had."""
    job = Job(job_id="j", name="j", target="host", task="detection", entry={}, subdir="", claim_dir="", manifest="j.yml",
              attempt=3)
    job.attempts = [{"attempt": n, **({"stopped": True} if stopped else {})}
                    for n, stopped in ((1, False), (2, False), (3, True), (3, True), (3, False))]
    assert spent(job) == 2
    job.attempts = [{"attempt": n, "stopped": True} for n in (1, 2, 3)] + [{"attempt": 4}]
    job.attempt = 4
    assert spent(job) == 1

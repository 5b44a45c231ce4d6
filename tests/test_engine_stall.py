"""A daemon on an engine that stops answering mid-step (issue 26, SPEC §15), against a real engine behind a relay that
can hang: restarts during the stall count no crash, a cancel wins at once, a planted pickle is never loaded."""

from __future__ import annotations

import functools
import json
import pickle
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from engineproxy import EngineProxy
from harness import wait_for
from test_daemon_docker import calls, cubie_daemon, in_quantize, procs, release  # noqa: F401 (cubie_daemon is a fixture)

from saigeedged.cli import main as cli

pytestmark = pytest.mark.docker
TIMEOUT_S = 4.0  # limits.engine_timeout_s of the tests that do not need it longer


def record_of(d: Any, job_id: str) -> dict[str, Any]:
    """The attempt record of the job's current attempt, as the store holds it."""
    with sqlite3.connect(d.state_dir / "saigeedged.db") as db:
        row = db.execute("SELECT doc FROM attempts WHERE job_id = ? ORDER BY take DESC LIMIT 1", (job_id,)).fetchone()
    return dict(json.loads(row[0]))


def downs(d: Any, at_least: int) -> bool:
    """Has the engine been marked down `at_least` times (by the daemons started so far)?"""
    return len(d.events("engine.down")) >= at_least


def test_restarts_during_an_engine_stall_count_no_crash(cubie_daemon: Any, docker_client: Any,  # noqa: F811
                                                        det_inputs: dict[str, Any], tmp_path: Path,
                                                        capsys: Any) -> None:
    """The only engine stops answering during a step for over 3x engine_timeout_s (a SIGSTOPped dockerd), with three
    restarts in between, the first while the worker is inside an engine call longer than the stop's grace: each
    SIGTERM exits 0 within 30 s, `status` says the engine does not answer, and once it answers the job succeeds in
    attempt 1 with quantize run once and no crash counted."""
    timeout_s = 30.0  # past the stop's 25 s grace: the first stop leaves the worker inside its call
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    d = cubie_daemon(env={"DOCKER_HOST": proxy.docker_host}, limits={"engine_timeout_s": timeout_s})
    job = in_quantize(d, docker_client, tmp_path, "stall_untilreleased", det_inputs["manifest"])
    steps = d.state_dir / "work" / job["job_id"] / "attempt1" / ".steps"
    quantize = max(int(p.stem) for p in steps.glob("*.log"))  # the step the stand-in waits in
    proxy.hang()
    release(docker_client, d)  # (straight to the engine)
    wait_for(lambda: (steps / f"{quantize}.rc").exists(), 30, "quantize to end: the worker's next call waits")
    wait_for(proxy.held.is_set, 30, "a call waiting on the hung engine")
    for restart in range(3):
        if restart:
            wait_for(functools.partial(downs, d, restart), 60, "the engine marked down")
            capsys.readouterr()
            assert cli.main(["status", "-c", str(d.config)]) == 0
            (local,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("local ")]
            assert local.split()[1] == "down" and "does not answer" in local, local
        d.signal(signal.SIGTERM)
        assert d.proc.wait(30) == 0
        d.start()
    assert d.status(job["job_id"])["state"] == "running"
    proxy.resume()
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=180)
    assert (done["state"], done["attempt"], done["error"]) == ("succeeded", 1, None), done
    assert len(calls(docker_client, d, "quantize")) == 1
    assert not d.events("job.requeued") and not d.events("job.internal_error")
    assert record_of(d, job["job_id"])["crashes"] == 0


def test_cancel_of_a_job_held_on_a_hung_engine_wins_at_once(cubie_daemon: Any, docker_client: Any,  # noqa: F811
                                                            det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """`saigeedged cancel` of a job whose engine hangs ends it cancelled while the engine still hangs; its step is
    killed once the engine answers."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    d = cubie_daemon(env={"DOCKER_HOST": proxy.docker_host}, limits={"engine_timeout_s": TIMEOUT_S})
    job = in_quantize(d, docker_client, tmp_path, "hangheld", det_inputs["manifest"])
    proxy.hang()
    assert cli.main(["cancel", job["job_id"], "-c", str(d.config)]) == 0
    done = d.wait_state(job["job_id"], ("cancelled",), timeout=60)
    assert done["error"]["code"] == "CANCELLED"
    assert "sleep 100000" in procs(docker_client, d)  # the engine has not answered yet: the step is still there
    assert (d.outbox / done["log"]).is_file() and [e["job_id"] for e in d.events("job.cancelled")] == [job["job_id"]]
    proxy.resume()
    wait_for(lambda: "sleep 100000" not in procs(docker_client, d), 60, "the step killed once the engine answers")


class Planted:
    """What a compiler step could write into its work dir: unpickling it touches a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_pickle_planted_in_the_work_dir_is_never_loaded(cubie_daemon: Any, docker_client: Any,  # noqa: F811
                                                          det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """The attempt's folder holds only what its steps wrote (the daemon's facts are in the store); a step writes
    `.steps/prepared.pickle` there (the bind-mounted work dir is writable from the container): the daemon restarted
    under it re-attaches from its store record, the pickle is never loaded, and the job succeeds."""
    d = cubie_daemon()
    job = in_quantize(d, docker_client, tmp_path, "plant_untilreleased", det_inputs["manifest"])
    d.signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0
    marker = tmp_path / "unpickled"
    work = d.state_dir / "work" / job["job_id"] / "attempt1"
    steps = sorted(p.name for p in (work / ".steps").iterdir())
    assert steps and all(name.endswith((".log", ".rc")) for name in steps), steps  # only what the steps wrote
    (work / ".steps" / "prepared.pickle").write_bytes(pickle.dumps(Planted(marker)))
    d.start()
    wait_for(lambda: d.events("job.reattached"), 60, "the new daemon re-attached")
    release(docker_client, d)
    done = d.wait_state(job["job_id"], ("succeeded", "failed"), timeout=90)
    assert (done["state"], done["attempt"]) == ("succeeded", 1)
    assert not marker.exists()
    assert len(calls(docker_client, d, "quantize")) == 1


def test_an_unreadable_record_requeues_the_attempt_after_killing_its_step(cubie_daemon: Any,  # noqa: F811
                                                                          docker_client: Any, tmp_path: Path,
                                                                          det_inputs: dict[str, Any]) -> None:
    """The record of a running attempt is of another version (a downgrade, a damaged row): the next start does not
    resume it; its step is killed and the job runs again as attempt 2, whose host steps never run beside it."""
    d = cubie_daemon()
    job = in_quantize(d, docker_client, tmp_path, "hangrecord", det_inputs["manifest"])
    d.kill()
    with sqlite3.connect(d.state_dir / "saigeedged.db") as db:
        db.execute("UPDATE attempts SET doc = json_set(doc, '$.version', 99) WHERE job_id = ?", (job["job_id"],))
    d.start()
    assert [e["job_id"] for e in d.events("job.record_unreadable")] == [job["job_id"]]  # said before READY=1
    assert d.status(job["job_id"])["attempt"] == 2  # requeued as a new attempt, before READY=1 too
    d.wait_state(job["job_id"], ("running",), timeout=60, step="quantize")
    assert not (d.state_dir / "work" / job["job_id"] / "attempt1").exists()  # reaped: its step killed first
    assert cli.main(["cancel", job["job_id"], "-c", str(d.config)]) == 0
    d.wait_state(job["job_id"], ("cancelled",), timeout=60)
    wait_for(lambda: "sleep 100000" not in procs(docker_client, d), 30, "no step left running")


def test_a_cancel_whose_status_write_fails_still_moves_the_log_and_says_so(cubie_daemon: Any,  # noqa: F811
                                                                          docker_client: Any, tmp_path: Path,
                                                                          det_inputs: dict[str, Any]) -> None:
    """The outbox refuses status files (status/ is not a writable folder: chmod 000 for the service user, a file in
    its place here, as root writes through any mode) when a running job is cancelled: its log still reaches the outbox
    and the journal has its job.cancelled; the status file follows once the folder is back."""
    d = cubie_daemon()
    job = in_quantize(d, docker_client, tmp_path, "hangcancel", det_inputs["manifest"])
    status = d.outbox / "status"
    status.rename(d.outbox / "status.aside")
    status.write_text("not a folder")
    try:
        assert cli.main(["cancel", job["job_id"], "-c", str(d.config)]) == 0
        wait_for(lambda: [e for e in d.events("job.cancelled") if e["job_id"] == job["job_id"]], 60,
                 "the journal's job.cancelled")
        wait_for(lambda: (d.outbox / "logs" / f"{job['job_id']}.log").is_file(), 30, "the log in the outbox")
        # the end writes its status file after job.cancelled: refused, before the folder comes back
        wait_for(lambda: [e for e in d.events("status.write_failed") if e["job_id"] == job["job_id"]], 30,
                 "the refused status write")
    finally:
        status.unlink()
        (d.outbox / "status.aside").rename(status)
    assert d.wait_state(job["job_id"], ("cancelled",), timeout=60)["error"]["code"] == "CANCELLED"

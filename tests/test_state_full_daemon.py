"""The daemon with state_dir on a full filesystem (issue 17): it stays up, drops wait, and work resumes with space."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fullfs import fill, mounted
from harness import drop, wait_for

from saigeedged.cli import main as cli


@pytest.fixture
def small_state(tmp_path: Path) -> Iterator[Path]:
    """A 64 MB tmpfs for state_dir: room for a job until it is filled."""
    with mounted(tmp_path / "small", "64m") as folder:
        yield folder


def test_a_full_state_dir_holds_drops_until_space_returns(daemon: Any, det_inputs: dict[str, Any],
                                                          small_state: Path) -> None:
    """state_dir fills under a running daemon: a drop is claimed but waits unqueued (no failed job), the daemon stays
    up, and once space is freed the job runs and succeeds."""
    d = daemon(state_dir=str(small_state / "state"), watch={"rescan_interval_s": 1})
    big = fill(small_state)
    drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
    wait_for(lambda: any("tried again" in e.get("message", "") for e in d.events("claim.unqueued")), 30,
             "the claim to wait for the database")
    assert d.proc.poll() is None and not [s for s in d.statuses() if s["state"] == "failed"]
    big.unlink()
    done = d.wait_job("det", timeout=120)
    assert done["state"] == "succeeded" and done["attempt"] == 1, done
    assert (d.outbox / done["bundle"]["path"]).is_file()


def test_a_start_on_a_full_state_dir_is_degraded_never_an_exit(daemon: Any, det_inputs: dict[str, Any],
                                                                small_state: Path) -> None:
    """Stopped cleanly, then state_dir filled: `run` starts degraded (READY=1, STATUS= and one journal line say
    state_dir is full, the watchdog pinged) instead of exiting, never calls the database corrupt, and once space
    returns it goes on with the same queue; a SIGTERM meanwhile exits 0."""
    d = daemon(state_dir=str(small_state / "state"))
    drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
    first = d.wait_job("det")
    assert first["state"] == "succeeded" and d.stop() == 0
    big = fill(small_state)
    d.env["WATCHDOG_USEC"] = "2000000"
    seen, said = len(d.messages), len(d.stderr())
    assert d.launch() is None  # READY=1, no exit
    d.expect("state_dir full: waiting for space", 10, after=seen)
    d.expect("WATCHDOG=1", 10, after=seen)
    assert d.stop() == 0
    assert "corrupt" not in d.stderr()[said:] and [e for e in d.events("state.full")]
    seen = len(d.messages)
    d.start()
    d.expect("state_dir full: waiting for space", 10, after=seen)
    big.unlink()
    drop(d.inbox, "again", det_inputs["onnx"], det_inputs["manifest"])
    assert d.wait_job("again", timeout=120)["state"] == "succeeded"
    assert cli.main(["status", first["job_id"], "--json", "-c", str(d.config)]) == 0

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


def test_a_start_on_a_full_state_dir_is_one_line_never_corrupt(daemon: Any, det_inputs: dict[str, Any],
                                                               small_state: Path) -> None:
    """Stopped cleanly, then state_dir filled: `run` exits 3 with one line (systemd starts it again), never calls the
    database corrupt; with space again it starts on the same queue."""
    d = daemon(state_dir=str(small_state / "state"))
    drop(d.inbox, "det", det_inputs["onnx"], det_inputs["manifest"])
    first = d.wait_job("det")
    assert first["state"] == "succeeded" and d.stop() == 0
    big = fill(small_state)
    seen = len(d.stderr())
    assert d.launch() == 3
    said = d.stderr()[seen:]
    assert len(said.strip().splitlines()) == 1 and "saigeedged.db" in said and "corrupt" not in said, said
    big.unlink()
    d.start()
    assert cli.main(["status", first["job_id"], "--json", "-c", str(d.config)]) == 0

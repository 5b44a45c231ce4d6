"""`saigeedged retry` of a failed job: the job log keeps every attempt, and a job whose inputs are gone is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from harness import drop, wait_for

from saigeedged.cli import main as cli


def failed_drop(d: Any, det_inputs: dict[str, Any], name: str) -> tuple[dict[str, Any], Path, str]:
    """A drop that fails CALIB_INVALID (a label out of range): its final status, its calibration file, the good text."""
    calib = Path(det_inputs["manifest"]["calib"])
    good = calib.read_text()
    doc = json.loads(good)
    doc["validation"][0]["labels"] = [9]
    calib.write_text(json.dumps(doc))
    drop(d.inbox, name, det_inputs["onnx"], det_inputs["manifest"])
    failed = d.wait_job(name)
    assert failed["error"]["code"] == "CALIB_INVALID"
    return failed, calib, good


def test_a_retried_jobs_log_keeps_the_earlier_attempts(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """A failed job retried to success: its log in the outbox holds attempt 1 with its failure, then attempt 2 (the
    retry's log replaced it, starting at `attempt 2`)."""
    d = daemon()
    failed, calib, good = failed_drop(d, det_inputs, "again")
    job_id = failed["job_id"]
    outbox_log = d.outbox / "logs" / f"{job_id}.log"
    first = outbox_log.read_text()
    assert f"### {job_id} attempt 1 " in first and "### CALIB_INVALID" in first
    calib.write_text(good)
    assert cli.main(["retry", job_id, "-c", str(d.config)]) == 0
    done = d.wait_state(job_id, ("succeeded",))
    assert done["attempt"] == 2
    local = d.state_dir / "logs" / f"{job_id}.log"
    wait_for(lambda: not local.exists(), 30, "the log moved to the outbox")
    both = outbox_log.read_text()
    assert both.startswith(first) and f"### {job_id} attempt 2 " in both[len(first):]


def test_retry_of_a_job_whose_inputs_were_removed_is_refused(daemon: Any, det_inputs: dict[str, Any],
                                                              capsys: Any) -> None:
    """A failed job whose failed/<job_id>/ folder was removed by hand: `retry` says its inputs are gone, where they
    were and to drop it again (exit 2), and the job stays failed (it was queued, then failed INPUT_NOT_FOUND)."""
    d = daemon()
    failed, _, _ = failed_drop(d, det_inputs, "gone")
    job_id = failed["job_id"]
    inputs = d.inbox / ".saigeedged" / "failed" / job_id
    shutil.rmtree(inputs)
    capsys.readouterr()
    assert cli.main(["retry", job_id, "-c", str(d.config)]) == 2
    first, hint = capsys.readouterr().err.splitlines()
    assert first == f"saigeedged: INPUT_NOT_FOUND: job {job_id}: its inputs are gone: {inputs} was removed"
    assert "drop its manifest and ONNX into the inbox again" in hint
    assert d.status(job_id) == failed


def test_retry_whose_inputs_cannot_be_moved_says_why_and_changes_nothing(daemon: Any, det_inputs: dict[str, Any],
                                                                         capsys: Any) -> None:
    """A failed job whose failed/<job_id>/ folder cannot be moved back under claimed/ (a folder the command's user may
    not write in: an immutable one here): one line naming both folders and a hint (exit 2), never a traceback, and the
    job stays failed."""
    import subprocess

    d = daemon()
    failed, _, _ = failed_drop(d, det_inputs, "stuck")
    job_id = failed["job_id"]
    parent = d.inbox / ".saigeedged" / "failed"
    subprocess.run(["chattr", "+i", str(parent)], check=True)
    try:
        capsys.readouterr()
        assert cli.main(["retry", job_id, "-c", str(d.config)]) == 2
        first, hint = capsys.readouterr().err.splitlines()
    finally:
        subprocess.run(["chattr", "-i", str(parent)], check=True)
    assert first.startswith(f"saigeedged: PATH_NOT_ALLOWED: job {job_id}: its inputs cannot be moved from "
                            f"{parent / job_id} to "), first
    assert "the daemon's user" in hint and d.status(job_id) == failed

"""Faults on the host target (issue 8): refused status files, blocked outbox folders, kills and a lost database."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from factory import classifier
from faults import bind_mount, full_fs, needs_root, set_read_only
from harness import drop, wait_for


@needs_root
def test_a_refused_final_status_is_written_after_a_restart(daemon: Any, det_inputs: dict[str, Any]) -> None:
    """status/ read-only while logs/ takes the log: the job ends unseen; after a restart with status/ writable
    again its status file says succeeded (the "not yet written" mark survives the restart)."""
    d = daemon()
    with bind_mount(d.outbox / "status", read_only=True):
        drop(d.inbox, "unseen", det_inputs["onnx"], det_inputs["manifest"])
        done = wait_for(lambda: d.events("job.succeeded"), 60, "the job to end")[0]
        assert (d.outbox / "logs" / f"{done['job_id']}.log").is_file() and d.status(done["job_id"]) is None
        assert d.stop() == 0
    d.start()
    assert d.wait_state(done["job_id"], ("succeeded",), timeout=30)["bundle"]


def test_a_blocked_status_folder_neither_aborts_a_claim_nor_fails_its_jobs(daemon: Any,
                                                                          det_inputs: dict[str, Any]) -> None:
    """outbox/status is a file: both entries of a multi-model drop are claimed and compiled; once status/ can be
    made their status files arrive (succeeded)."""
    d = daemon()
    (d.outbox / "status").write_text("in the way")
    classifier(d.inbox / "cls.onnx", 3, (224, 224))
    (d.inbox / "det.onnx").write_bytes(det_inputs["onnx"].read_bytes())
    m = det_inputs["manifest"]
    (d.inbox / "pair.yml").write_text(yaml.safe_dump({"target": "host", "models": [
        {**m, "onnx": "det.onnx", "name": "pdet"}, {**m, "task": "mlc", "onnx": "cls.onnx", "name": "pcls"}]}))
    ended = wait_for(lambda: len(d.events("job.succeeded")) == 2 and d.events("job.succeeded"), 90, "both jobs")
    (d.outbox / "status").unlink()
    for e in ended:
        assert d.wait_state(e["job_id"], ("succeeded",), timeout=30)["name"] in ("pdet", "pcls")
    assert not list((d.inbox / ".saigeedged" / "claimed").iterdir())


def test_an_outbox_sub_folder_that_cannot_be_made_is_retried_not_internal(daemon: Any,
                                                                         det_inputs: dict[str, Any]) -> None:
    """<outbox>/sub is a file where the bundle's folder should be: publishing is retried (PUBLISH_FAILED, not
    INTERNAL) and the job succeeds, compiled once, when the folder can be made."""
    d = daemon()
    (d.outbox / "sub").write_text("in the way")
    drop(d.inbox / "sub", "nested", det_inputs["onnx"], det_inputs["manifest"])
    retrying = wait_for(lambda: d.events("publish.retrying"), 60, "a refused publish")[0]
    assert retrying["error_code"] == "PUBLISH_FAILED" and "sub" in retrying["message"]
    (d.outbox / "sub").unlink()
    done = d.wait_job("nested")
    assert (done["state"], done["attempt"], done["bundle"]["path"]) == ("succeeded", 1, "sub/nested.host.saigeedge")
    assert len([e for e in d.events("job.step") if e["step"] == "calibration"]) == 1


@needs_root
def test_a_full_outbox_keeps_the_built_bundles_until_it_has_room(daemon: Any, det_inputs: dict[str, Any],
                                                                tmp_path: Path) -> None:
    """No room for bundles: every job waits in its publish step with its bundle built; once there is room all
    succeed, each compiled once, at attempt 1."""
    with full_fs(tmp_path / "outbox") as filler:
        os.truncate(filler, filler.stat().st_size - 16 * 1024)  # room for status files and logs, not a bundle
        d = daemon()
        for name in ("full1", "full2", "full3"):
            drop(d.inbox, name, det_inputs["onnx"], det_inputs["manifest"])
        wait_for(lambda: len(d.events("publish.retrying")) >= 2, 60, "a refused publish tried again")
        filler.unlink()
        docs = [d.wait_job(name) for name in ("full1", "full2", "full3")]
        assert [(x["state"], x["attempt"]) for x in docs] == [("succeeded", 1)] * 3
        assert all((d.outbox / x["bundle"]["path"]).is_file() for x in docs)
        assert len([e for e in d.events("job.step") if e["step"] == "quantize"]) == 3 and not d.events("job.requeued")
        d.close()


@needs_root
def test_a_read_only_outbox_holds_publishing_and_status_files_until_it_is_writable(daemon: Any,
                                                                                  det_inputs: dict[str, Any],
                                                                                  tmp_path: Path) -> None:
    """The outbox remounted read-only (EROFS) mid-run: jobs wait to publish instead of failing INTERNAL, and
    once it is writable again they succeed and their status files say so."""
    with bind_mount(tmp_path / "outbox") as outbox:
        d = daemon()
        drop(d.inbox, "before", det_inputs["onnx"], det_inputs["manifest"])
        assert d.wait_job("before")["state"] == "succeeded"
        set_read_only(outbox, True)
        drop(d.inbox, "during", det_inputs["onnx"], det_inputs["manifest"])
        retrying = wait_for(lambda: d.events("publish.retrying"), 60, "a refused publish")[0]
        assert "Read-only" in retrying["message"]
        set_read_only(outbox, False)
        done = d.wait_job("during")
        assert (done["state"], done["attempt"]) == ("succeeded", 1) and not d.events("job.internal_error")
        assert not d.events("job.failed")
        d.close()

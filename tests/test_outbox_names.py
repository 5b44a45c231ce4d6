"""A drop's `output` never lands on the daemon's own files in the outbox (status files, logs, the dashboard page)."""

from __future__ import annotations

import json
from typing import Any

from harness import drop


def test_output_onto_another_jobs_status_file_or_the_page_fails_before_compiling(daemon: Any,
                                                                                   det_inputs: dict[str, Any]) -> None:
    """`output: status/<other job>.json`, `logs/...`, `index.html` or `.` (the drop folder itself) fail as
    MANIFEST_INVALID naming the path; the other job's status file and the dashboard page stay what they were, and
    later drops still succeed."""
    d = daemon(dashboard=True)
    drop(d.inbox, "first", det_inputs["onnx"], det_inputs["manifest"])
    first = d.wait_job("first")
    for name, output in (("forge", f"status/{first['job_id']}.json"), ("logfake", f"logs/{first['job_id']}.log"),
                         ("page", "index.html"), ("dot", ".")):
        drop(d.inbox, name, det_inputs["onnx"], {**det_inputs["manifest"], "output": output})
        doc = d.wait_job(name)
        assert (doc["state"], doc["error"]["code"]) == ("failed", "MANIFEST_INVALID"), doc
        assert output in doc["error"]["message"] and doc["bundle"] is None
    assert json.loads((d.outbox / "status" / f"{first['job_id']}.json").read_text())["state"] == "succeeded"
    assert (d.outbox / "logs" / f"{first['job_id']}.log").read_bytes()[:2] != b"PK"
    assert (d.outbox / "index.html").read_bytes()[:2] != b"PK"
    drop(d.inbox, "after", det_inputs["onnx"], det_inputs["manifest"])
    assert d.wait_job("after")["state"] == "succeeded"

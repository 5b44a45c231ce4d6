"""Size and memory (issue 9 class 5, issue 8 items 11 and 18): models and calibration lists are read by a
memory-bounded child, so the daemon's own memory does not grow with them; one too large for the bound fails alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from factory import classifier, valjson
from harness import drop
from hostile import RSS_BOUND, canary, final, peak_rss
from onnx import numpy_helper

pytestmark = [pytest.mark.memory, pytest.mark.timeout(900)]  # their own waits add up past the default 300 s

BALLAST = 450 << 20  # bytes of weights: more than the daemon may grow by


def heavy(path: Path) -> Path:
    """A small classifier carrying a large (unused) initializer, stored inside the ONNX file itself."""
    model = onnx.load(str(classifier(path, 3, (32, 32))))
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(BALLAST // 4, np.float32), "ballast"))
    onnx.save(model, str(path))
    return path


def test_large_model_and_calibration_list_stay_out_of_the_daemon(daemon: Any, det_inputs: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    """A 450 MB model and a million-entry val.json are checked (and fail on their own faults) without the daemon growing."""
    model = heavy(tmp_path / "heavy.onnx")
    wrong_classes = valjson(tmp_path / "data" / "four", [[0], [1], [2], [3]])
    million = million_entries(tmp_path / "data" / "million.json")
    d = daemon()
    base = {"task": "mlc", "num_classes": 3, "input_size": [32, 32], "n_samples": 4}
    drop(d.inbox, "heavy", model, {**base, "calib": str(wrong_classes)})
    drop(d.inbox, "million", det_inputs["onnx"], {**det_inputs["manifest"], "calib": str(million)})
    heavy_doc, million_doc = final(d, "heavy.yml", 180), final(d, "million.yml", 180)
    assert heavy_doc["error"]["code"] == "CALIB_INVALID" and "n_classes is 4" in heavy_doc["error"]["message"], heavy_doc
    assert heavy_doc["inputs"]["onnx_sha256"]  # the model was read, checked and passed before the calibration check
    assert million_doc["error"]["code"] == "CALIB_INVALID" and "1000000 image(s) missing" in million_doc["error"]["message"]
    canary(d, det_inputs)
    assert peak_rss(d) < RSS_BOUND


def million_entries(path: Path) -> Path:
    """A val.json listing a million images that do not exist (about 40 MB of JSON)."""
    path.write_text(json.dumps({"n_classes": 3, "validation": [{"image": f"img/{i}.jpg", "labels": [i % 3]}
                                                               for i in range(1_000_000)]}))
    return path


def test_inputs_over_the_memory_bound_fail_alone(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """A model or calibration list that needs more than limits.child_memory_bytes fails ONNX_INVALID / CALIB_INVALID
    naming the limit; the next drop succeeds."""
    model = heavy(tmp_path / "heavy.onnx")
    million = million_entries(tmp_path / "data" / "million.json")
    d = daemon(limits={"child_memory_bytes": 256 << 20})
    drop(d.inbox, "heavy", model, {"task": "mlc", "num_classes": 3, "input_size": [32, 32],
                                   "calib": det_inputs["manifest"]["calib"]})
    drop(d.inbox, "million", det_inputs["onnx"], {**det_inputs["manifest"], "calib": str(million)})
    doc = final(d, "heavy.yml", 180)
    assert doc["state"] == "failed" and doc["error"]["code"] == "ONNX_INVALID", doc
    assert "limits.child_memory_bytes" in doc["error"]["message"] and doc["error"]["step"] == "validate"
    doc = final(d, "million.yml", 180)
    assert doc["error"]["code"] == "CALIB_INVALID" and "limits.child_memory_bytes" in doc["error"]["message"], doc
    canary(d, det_inputs)


def test_oversized_onnx_with_a_digest_is_not_read_by_the_scan(daemon: Any, det_inputs: dict[str, Any],
                                                               tmp_path: Path) -> None:
    """A (sparse) 64 GB ONNX whose manifest names a sha256 is not hashed by the scan: it fails ONNX_INVALID at once."""
    d = daemon(limits={"max_onnx_bytes": 1 << 20})
    with open(d.inbox / "vast.onnx", "wb") as fh:
        fh.truncate(64 << 30)
    (d.inbox / "vast.yml").write_text(json.dumps({**det_inputs["manifest"], "sha256": "0" * 64}))
    doc = final(d, "vast.yml", 60)
    assert doc["error"]["code"] == "ONNX_INVALID" and "max_onnx_bytes" in doc["error"]["message"], doc
    canary(d, det_inputs)

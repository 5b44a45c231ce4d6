"""`saigeedged submit` of one name from many shells at once (issue 17): each submission is its own job."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml
from factory import manifest, yolox

from saigeedged.compile.inputs import sha256_file

PARALLEL = 8


def test_parallel_submits_of_one_name_are_one_job_each(daemon: Any, det_inputs: dict[str, Any], tmp_path: Path) -> None:
    """Eight `submit x.onnx x.yml --wait` at once, each of a different model: 8 jobs named x, 8 exits 0, the status
    file each submit found by its request id and the bundle it names carry the digest of that submit's model."""
    d = daemon()
    runs = []
    for n in range(PARALLEL):
        folder = tmp_path / f"run{n}"
        folder.mkdir()
        model = yolox(folder / "x.onnx", size=(64, 64), seed=n)  # a sweep: the same name, other weights
        mf = manifest(folder / "x.yml", **det_inputs["manifest"])
        runs.append((model, subprocess.Popen([sys.executable, "-m", "saigeedged", "submit", str(model), str(mf), "--wait",
                                              "--timeout", "300", "-c", str(d.config)],
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    jobs = set()
    for model, proc in runs:
        out, err = proc.communicate(timeout=400)
        assert proc.returncode == 0, out + err
        status = json.loads(Path(out.splitlines()[0]).read_text())
        assert status["state"] == "succeeded" and status["name"] == "x" and status["job_id"].startswith("x-")
        assert status["inputs"]["onnx_sha256"] == sha256_file(model)
        with zipfile.ZipFile(d.outbox / status["bundle"]["path"]) as bundle:
            assert yaml.safe_load(bundle.read("checkpoint.yaml"))["source"]["sha256"] == sha256_file(model)
        jobs.add(status["job_id"])
    assert len(jobs) == PARALLEL
    docs = [json.loads(p.read_text()) for p in (d.outbox / "status").glob("*.json")]
    assert len(docs) == PARALLEL and all(doc["state"] == "succeeded" and doc["request_id"] for doc in docs)
    assert len({doc["request_id"] for doc in docs}) == PARALLEL  # no stray job without a request id

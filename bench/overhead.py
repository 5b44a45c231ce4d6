"""Whole-job overhead, measured from outside (not a test): a queue of cubie jobs on the stand-in compiler (which
does no work), time per job from the first `running` status file to the last `succeeded` one, against the bare
`docker exec` floor of the same exec calls (the five pegasus steps), with prep-ahead off and on.

    .venv/bin/python bench/overhead.py [--jobs 10] [--runs 3]

bench/bench.py runs it too and puts the figures in its table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).parent))
from harness import Daemon, read_status  # noqa: E402

from bench import STANDIN, config, inputs  # noqa: E402
from saigeedged.compile.inputs import sha256_file  # noqa: E402


def _queue(d: Daemon, onnx: Path, manifest: dict[str, Any], n: int, tag: str) -> list[str]:
    """n drops moved into the inbox at once; their job ids once all are claimed."""
    staging = d.inbox.parent / f"staging-{tag}"
    staging.mkdir()
    for i in range(n):
        shutil.copyfile(onnx, staging / f"{tag}{i:03d}.onnx")
        (staging / f"{tag}{i:03d}.yml").write_text(yaml.safe_dump(manifest))
    for path in sorted(staging.iterdir(), key=lambda p: p.suffix != ".onnx"):
        path.rename(d.inbox / path.name)
    folder = d.outbox / "status"
    while len(ids := sorted(p.stem for p in folder.glob(f"{tag}*.json"))) < n:
        time.sleep(0.002)
    return ids


def _per_job(d: Daemon, ids: list[str]) -> float:
    """Seconds per job: from the first job seen running to the last one succeeded, over the number of jobs."""
    first = None
    pending = set(ids)
    while pending:
        for job_id in sorted(pending):
            doc = read_status(d.outbox, job_id)
            if doc is None:
                continue
            if first is None and doc["state"] != "queued":
                first = time.monotonic()
            if doc["state"] in ("succeeded", "failed", "cancelled"):
                assert doc["state"] == "succeeded", doc
                pending.discard(job_id)
        time.sleep(0.002)
    assert first is not None
    return (time.monotonic() - first) / len(ids)


def _bare(container: str, work: Path, argvs: list[list[str]], runs: int) -> float:
    """Seconds for the job's exec calls issued bare (create, stream, inspect) in the same container."""
    import docker

    client = docker.from_env()
    ctr = client.containers.get(container)
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        for argv in argvs:
            exec_id = client.api.exec_create(ctr.id, argv, workdir=str(work))["Id"]
            for _chunk in client.api.exec_start(exec_id, stream=True):
                pass
            while client.api.exec_inspect(exec_id)["Running"]:
                time.sleep(0.005)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def whole_job(jobs: int, runs: int, prepare_ahead: bool) -> dict[str, float]:
    """Median seconds per job over `runs` queues of `jobs` drops, the bare floor, and their ratio."""
    import docker

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        onnx, manifest = inputs(root)
        manifest = {**manifest, "sha256": sha256_file(onnx), "cache": False}  # every job compiles
        name = f"saige-bench-whole-{os.getpid()}"
        cfg = config(root, cubie={"image": STANDIN, "container": name}, keep_work=True, defaults={"target": "cubie"},
                     limits={"prepare_ahead": prepare_ahead})
        d = Daemon(cfg).start()
        try:
            _per_job(d, _queue(d, onnx, manifest, 1, "warm"))  # creates the container, probes pegasus
            per_job = [_per_job(d, _queue(d, onnx, manifest, jobs, f"r{run}x")) for run in range(runs)]
            last = json.loads(sorted((d.outbox / "status").glob("r*.json"))[-1].read_text())
            log = (d.outbox / last["log"]).read_text()
            argvs = [line[2:].split() for line in log.splitlines() if line.startswith("$ ")]
            bare = _bare(name, root / "state" / "work" / last["job_id"], argvs, runs * 3)
        finally:
            d.stop()
            d.close()
            docker.from_env().containers.get(name).remove(force=True)
    job_s = statistics.median(per_job)
    return {"jobs": jobs, "execs_per_job": len(argvs), "per_job_s": job_s, "bare_execs_s": bare, "ratio": job_s / bare}


def measure(jobs: int, runs: int) -> dict[str, dict[str, float]]:
    return {"ahead_off": whole_job(jobs, runs, False), "ahead_on": whole_job(jobs, runs, True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = measure(args.jobs, args.runs)
    for label, row in results.items():
        print(f"{label:<10} per job {row['per_job_s']:.3f}s  bare {row['execs_per_job']:.0f} execs "
              f"{row['bare_execs_s']:.3f}s  ratio {row['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

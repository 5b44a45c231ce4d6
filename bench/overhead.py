"""Whole-job overhead, measured from outside (not a test): a queue of cubie jobs on the stand-in compiler (which
does no work), time per job from the first `running` status file to the last `succeeded` one, against the bare
`docker exec` floor of the same exec calls (the five pegasus steps), with prep-ahead off and on.

    .venv/bin/python bench/overhead.py [--jobs 10] [--runs 3]

bench/bench.py runs it too and puts the figures in its table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).parent))
from harness import Daemon, read_status  # noqa: E402

from bench import STANDIN, bare_execs, config, inputs  # noqa: E402
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


@contextlib.contextmanager
def _daemon(root: Path, prepare_ahead: bool) -> Iterator[tuple[Daemon, str, Path, dict[str, Any]]]:
    """A daemon on its own folders and container, warmed by one job (container made, pegasus probed)."""
    import docker

    root.mkdir()
    onnx, manifest = inputs(root)
    manifest = {**manifest, "sha256": sha256_file(onnx), "cache": False}  # every job compiles
    name = f"saige-bench-whole-{os.getpid()}-{int(prepare_ahead)}"
    cfg = config(root, cubie={"image": STANDIN, "container": name}, keep_work=True, defaults={"target": "cubie"},
                 limits={"prepare_ahead": prepare_ahead})
    d = Daemon(cfg).start()
    try:
        _per_job(d, _queue(d, onnx, manifest, 1, "warm"))
        yield d, name, onnx, manifest
    finally:
        d.stop()
        d.close()
        docker.from_env().containers.get(name).remove(force=True)


def _floor(d: Daemon, name: str, runs: int) -> tuple[int, float]:
    """(exec calls per job, their bare seconds) from the last job's log."""
    last = json.loads(sorted((d.outbox / "status").glob("r*.json"))[-1].read_text())
    log = (d.outbox / last["log"]).read_text()
    argvs = [line[2:].split() for line in log.splitlines() if line.startswith("$ ")]
    return len(argvs), statistics.median(bare_execs(name, d.state_dir / "work" / last["job_id"], argvs, runs))


def measure(jobs: int, runs: int) -> dict[str, dict[str, float]]:
    """Per-job seconds with prep-ahead off and on (two daemons, their queues run in turn so that the load of the
    machine hits both alike), the bare floor measured the same way, and the ratios."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        daemons = {mode: stack.enter_context(_daemon(Path(tmp) / mode, mode == "ahead_on"))
                   for mode in ("ahead_off", "ahead_on")}
        per_job: dict[str, list[float]] = {mode: [] for mode in daemons}
        bare: dict[str, list[float]] = {mode: [] for mode in daemons}
        for run in range(runs):
            for mode, (d, name, onnx, manifest) in daemons.items():
                per_job[mode].append(_per_job(d, _queue(d, onnx, manifest, jobs, f"r{run}x")))
                execs, seconds = _floor(d, name, 3)
                bare[mode].append(seconds)
    out = {}
    for mode in daemons:
        job_s, bare_s = statistics.median(per_job[mode]), statistics.median(bare[mode])
        out[mode] = {"jobs": jobs, "execs_per_job": execs, "per_job_s": job_s, "bare_execs_s": bare_s,
                     "ratio": job_s / bare_s}
    return out


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

"""A burst of cache-off cubie (or host) drops of a YOLOX-nano-shaped detector through the daemon (issue 25, not a test): the
time from the drops to the last job's end with the report on (the default 16 held-out images) and with
`eval_samples: 0`, and their ratio; the CPU each burst used (the machine's, from /proc/stat: run it on an idle
machine) and what 1.3x would leave the reports a job. Each run has its own state dir, container and daemon (under
`prlimit --as` when asked); the stand-in ACUITY image is SAIGEEDGED_STANDIN_ACUITY (default saigeedged-standin/acuity:test).

    .venv/bin/python bench/burst.py [--drops 30] [--size 640] [--prlimit 6000000000]

The stand-in compiler does no work: each job's container steps take a fraction of a second. Each run prints where a
job's time went (`paths`): the next job starts when the last one's container part ends, so the burst is at least the
jobs' container paths end to end; with the report on, the reports (`finishing`: cubie's simulator call, the report
child and the bundle) run beside the next jobs, and the path grows by the CPU they take. Once the machine's cores are
busy the burst is as long as the CPU of the jobs and their reports (`finishing` grows: reports wait for a finisher).

The stand-in's `pegasus inference` answers only for images it has reference tensors of, else exits 1 and the report
falls back to the host emulation (a quantization of the float model and both models on the images). `--simulator`
puts reference tensors for every calibration image into the container first (the float heads rounded to 256 levels,
as tests/test_accuracy.py does), so the cubie reports take the simulator path a real ACUITY image takes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).parent))
from cpusample import HZ, busy  # noqa: E402
from factory import random_labels, valjson  # noqa: E402
from harness import Daemon  # noqa: E402
from realmodels import yolox_nano  # noqa: E402
from simrefs import put_references, references  # noqa: E402

STANDIN = os.environ.get("SAIGEEDGED_STANDIN_ACUITY", "saigeedged-standin/acuity:test")


def _container(name: str) -> Any:
    """The daemon's container (docker-py's), once it has made it."""
    import docker

    client = docker.from_env()
    deadline = time.monotonic() + 10
    while True:
        try:
            return client.containers.get(name)
        except docker.errors.NotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def paths(events: list[dict[str, Any]]) -> dict[str, float]:
    """Where a burst job's time went, mean seconds per job: `container_path` from its start to the end of its container
    part (`job.finishing`, or its end without a report), which the next job waits for; `export_step` its last
    container step; `finishing` the simulator's `pegasus inference`, the report and the bundle after it, made beside
    the next jobs."""
    def at(e: dict[str, Any]) -> float:
        return datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()

    jobs: dict[str, dict[str, float]] = {}
    for e in events:
        if str(e.get("job_name", "")).startswith("b"):
            marks = jobs.setdefault(e["job_id"], {})
            key = "export" if e["event"] == "job.step" and e.get("step") == "export" else e["event"]
            marks.setdefault(key, at(e))
    done = [m for m in jobs.values() if {"job.started", "export", "job.succeeded"} <= m.keys()]
    if not done:
        return {}
    ended = [m.get("job.finishing", m["job.succeeded"]) for m in done]
    mean = lambda xs: round(sum(xs) / len(xs), 3)  # noqa: E731
    return {"container_path": mean([e - m["job.started"] for m, e in zip(done, ended, strict=True)]),
            "export_step": mean([e - m["export"] for m, e in zip(done, ended, strict=True)]),
            "finishing": mean([m["job.succeeded"] - e for m, e in zip(done, ended, strict=True)])}


def burst(root: Path, drops: int, size: int, eval_samples: int, prlimit: str | None, target: str = "cubie",
          simulator: bool = False, held_out: int = 32) -> dict[str, Any]:
    """Seconds from the drops to the last job's end, and the jobs' states."""
    root.mkdir(parents=True)
    container = f"saige-burst-{os.getpid()}-{root.name}"
    config = root / "saigeedged.yml"
    config.write_text(yaml.safe_dump({
        "inbox": str(root / "inbox"), "outbox": str(root / "outbox"), "state_dir": str(root / "state"),
        "allowed_roots": [str(root / "data")], "log": {"format": "json"}, "watch": {"settle_s": 0.5},
        "cubie": {"image": STANDIN, "container": container}, "defaults": {"target": target}}))
    onnx = yolox_nano(root / "det.onnx", size)
    calib = valjson(root / "data", random_labels(16 + held_out, 3))
    manifest = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 16, "cache": False,
                "eval_samples": eval_samples}
    staging = root / "staging"
    staging.mkdir()
    for i in range(drops):  # made beside the inbox, moved in at once
        shutil.copyfile(onnx, staging / f"b{i:03d}.onnx")
        (staging / f"b{i:03d}.yml").write_text(yaml.safe_dump(manifest))
    tensors = references(onnx, root / "data" / "images", size) if simulator and eval_samples else None
    d = Daemon(config)
    d.prefix = ["prlimit", f"--as={prlimit}"] if prlimit else []
    d.start()
    try:
        if tensors is not None:  # the daemon makes its container for its first job: a warm-up job, not timed
            shutil.copyfile(onnx, d.inbox / "warm.onnx")
            (d.inbox / "warm.yml").write_text(yaml.safe_dump({**manifest, "eval_samples": 0}))
            while not [doc for p in (d.outbox / "status").glob("warm*.json")
                       if (doc := json.loads(p.read_text()))["state"] in ("succeeded", "failed")]:
                time.sleep(0.5)
            put_references(_container(container), tensors)
        start, idle_before = time.monotonic(), busy()
        for path in sorted(staging.iterdir(), key=lambda p: p.suffix != ".onnx"):
            path.rename(d.inbox / path.name)
        while True:
            docs = [json.loads(p.read_text()) for p in (d.outbox / "status").glob("b*.json")]
            if len(docs) == drops and all(doc["state"] in ("succeeded", "failed") for doc in docs):
                break
            time.sleep(0.5)
        seconds, idle_after = time.monotonic() - start, busy()
        used = ((idle_after[1] - idle_before[1]) - (idle_after[0] - idle_before[0])) / HZ
        methods = sorted({(doc.get("accuracy") or {}).get("method") for doc in docs} - {None})
        return {"seconds": seconds, "cpu_s": round(used, 1), "states": sorted({doc["state"] for doc in docs}),
                "errors": sorted({doc["error"]["code"] for doc in docs if doc["error"]}), "methods": methods,
                **paths(d.events())}
    finally:
        d.stop()
        d.close()
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drops", type=int, default=30)
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--prlimit", default=None)
    parser.add_argument("--target", default="cubie", choices=("cubie", "host"))
    parser.add_argument("--simulator", action="store_true", help="reference tensors in the stand-in first (cubie)")
    parser.add_argument("--held-out", type=int, default=32,
                        help="calibration images beyond the 16 calibration takes (the report uses up to 16 of them)")
    parser.add_argument("--skip-off", type=float, default=None, help="the eval_samples 0 burst's seconds, not rerun")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        off = {"seconds": args.skip_off} if args.skip_off else burst(Path(tmp) / "off", args.drops, args.size, 0,
                                                                     args.prlimit, args.target, held_out=args.held_out)
        print(f"eval_samples 0: {off}", flush=True)
        on = burst(Path(tmp) / "on", args.drops, args.size, 16, args.prlimit, args.target, args.simulator,
                   args.held_out)
        print(f"report on (16): {on}", flush=True)
    print(f"{args.drops} drops of a {args.size} detector: report on {on['seconds']:.1f} s, eval_samples 0 "
          f"{off['seconds']:.1f} s, ratio {on['seconds'] / off['seconds']:.2f}; load average after: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if "cpu_s" in off:
        print(budget(off["seconds"], off["cpu_s"], on["cpu_s"], args.drops))


def budget(off_s: float, off_cpu: float, on_cpu: float, drops: int, ratio: float = 1.3) -> str:
    """What the reports cost against what `ratio` leaves them: every core this process may use busy for ratio x the
    `eval_samples: 0` burst, less that burst's own CPU (the machine's, /proc/stat: on an idle machine the burst's)."""
    cores = len(os.sched_getaffinity(0))
    room = (cores * ratio * off_s - off_cpu) / drops
    return (f"CPU: eval_samples 0 {off_cpu:.1f} s ({off_cpu / drops:.2f} a job), report on {on_cpu:.1f} s: the reports "
            f"{(on_cpu - off_cpu) / drops:.2f} CPU-s a job, against {room:.2f} that {ratio}x leaves them on {cores} "
            f"cores fully busy")


if __name__ == "__main__":
    main()

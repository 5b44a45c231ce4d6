"""Benchmark of the daemon (not a test): claim latency, per-job overhead vs bare docker execs, burst claims,
idle CPU and resident memory, whole-job overhead with prep-ahead off and on (bench/overhead.py). Prints a table
and writes bench/results.json.

    .venv/bin/python bench/bench.py [--idle-seconds 60] [--out bench/results.json]

Needs the stand-in ACUITY image (scripts/test builds it) for the overhead figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from harness import Daemon  # noqa: E402

from saigeedged.cli import examples  # noqa: E402
from saigeedged.compile.inputs import sha256_file  # noqa: E402

STANDIN = "saigeedged-standin/acuity:test"
SETTLE = 1.0


def config(root: Path, **extra: Any) -> Path:
    data: dict[str, Any] = {"inbox": str(root / "inbox"), "outbox": str(root / "outbox"), "state_dir": str(root / "state"),
                            "allowed_roots": [str(root / "data")], "log": {"format": "json"},
                            "watch": {"settle_s": SETTLE, "poll_interval_s": 1.0}, "defaults": {"target": "host"}}
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = root / "saigeedged.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def inputs(root: Path) -> tuple[Path, dict[str, Any]]:
    onnx = examples.yolox(root / "det.onnx", 3, (64, 64))
    calib = examples.valjson(root / "data", examples.random_labels(8, 3))
    return onnx, {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 4}


def drop_now(inbox: Path, stem: str, onnx: Path, manifest: dict[str, Any]) -> float:
    """Drop (ONNX then manifest, renamed into place); returns the time the manifest appeared."""
    tmp = inbox / f".{stem}.onnx.part"
    shutil.copyfile(onnx, tmp)
    tmp.rename(inbox / f"{stem}.onnx")
    tmp = inbox / f".{stem}.yml.part"
    tmp.write_text(yaml.safe_dump(manifest))
    t = time.monotonic()
    tmp.rename(inbox / f"{stem}.yml")
    return t


def wait_status(d: Daemon, stem: str, states: tuple[str, ...], timeout: float = 120) -> tuple[float, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    folder = d.outbox / "status"
    while time.monotonic() < deadline:
        for path in folder.glob(f"{stem}-*.json") if folder.exists() else []:
            try:
                doc = json.loads(path.read_text())
            except ValueError:
                continue
            if doc["state"] in states:
                return time.monotonic(), doc
        time.sleep(0.002)
    raise TimeoutError(stem)


def claim_latency(mode: str, with_sha: bool, runs: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        onnx, manifest = inputs(root)
        if with_sha:
            manifest["sha256"] = sha256_file(onnx)
        d = Daemon(config(root, watch={"mode": mode}, defaults={"target": "host"})).start()
        out = []
        try:
            for i in range(runs):
                t0 = drop_now(d.inbox, f"lat{i}", onnx, manifest)
                t1, _ = wait_status(d, f"lat{i}", ("queued", "running", "succeeded"))
                out.append(t1 - t0)
                wait_status(d, f"lat{i}", ("succeeded", "failed"))
        finally:
            d.stop()
            d.close()
        return out


def bare_execs(container: str, work: Path, argvs: list[list[str]], runs: int) -> list[float]:
    """Seconds for `argvs` issued as bare execs (create, stream, inspect) in the container, once per run."""
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
    return times


def overhead(runs: int) -> dict[str, float]:
    """Daemon time of a cubie job's five pegasus steps vs the same argv as bare execs in the same container (`cache:
    false`: every drop compiles)."""
    import docker

    client = docker.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        onnx, manifest = inputs(root)
        name = f"saige-bench-{os.getpid()}"
        cfg = config(root, cubie={"image": STANDIN, "container": name}, keep_work=True,
                     defaults={"target": "cubie"}, watch={"settle_s": 0.2})
        d = Daemon(cfg).start()
        step_times = []
        try:
            for i in range(runs + 1):
                drop_now(d.inbox, f"ovh{i}", onnx, {**manifest, "sha256": sha256_file(onnx), "cache": False})
                _, doc = wait_status(d, f"ovh{i}", ("succeeded", "failed"))
                assert doc["state"] == "succeeded", doc
                log = (d.outbox / doc["log"]).read_text()
                if i:  # the first job creates the container
                    step_times.append(sum(float(line.split(" in ")[1].rstrip("s")) for line in log.splitlines()
                                          if line.startswith("----- ") and line.split(":")[0][6:] in
                                          ("import", "inputmeta", "postprocess", "quantize", "export")))
            work = root / "state" / "work" / doc["job_id"]
            argvs = [line[2:].split() for line in log.splitlines() if line.startswith("$ ")]
            bare = bare_execs(name, work, argvs, runs)
        finally:
            d.stop()
            d.close()
            client.containers.get(name).remove(force=True)
        return {"daemon_steps_s": statistics.median(step_times), "bare_execs_s": statistics.median(bare),
                "ratio": statistics.median(step_times) / statistics.median(bare)}


def cache_hit(runs: int) -> dict[str, float]:
    """A cubie drop whose compile is in the cache: manifest renamed in -> `succeeded`; `submit --wait` of the same."""
    import docker

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        onnx, manifest = inputs(root)
        name = f"saige-bench-cache-{os.getpid()}"
        cfg = config(root, cubie={"image": STANDIN, "container": name}, defaults={"target": "cubie"})
        d = Daemon(cfg).start()
        drops, submits = [], []
        try:
            drop_now(d.inbox, "warm", onnx, {**manifest, "sha256": sha256_file(onnx)})  # compiles, fills the cache
            assert wait_status(d, "warm", ("succeeded", "failed"))[1]["state"] == "succeeded"
            for i in range(runs):
                t0 = drop_now(d.inbox, f"hit{i}", onnx, {**manifest, "sha256": sha256_file(onnx)})
                t1, doc = wait_status(d, f"hit{i}", ("succeeded", "failed"))
                assert doc["state"] == "succeeded" and doc["cache"]["hit"], doc
                drops.append(t1 - t0)
            (root / "sub.yml").write_text(yaml.safe_dump(manifest))
            for _ in range(runs):
                t0 = time.monotonic()
                proc = subprocess.run([sys.executable, "-m", "saigeedged", "submit", str(onnx), str(root / "sub.yml"),
                                       "--wait", "-c", str(cfg)], capture_output=True, check=False)
                submits.append(time.monotonic() - t0)
                assert proc.returncode == 0, proc.stdout + proc.stderr
        finally:
            d.stop()
            d.close()
            docker.from_env().containers.get(name).remove(force=True)
        return {"drop_to_succeeded_s": statistics.median(drops), "drop_max_s": max(drops),
                "submit_wait_s": statistics.median(submits), "submit_wait_max_s": max(submits)}


def burst(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        onnx, manifest = inputs(root)
        manifest["sha256"] = sha256_file(onnx)
        d = Daemon(config(root)).start()
        try:
            staging = root / "staging"
            staging.mkdir()
            for i in range(n):  # prepared beside the inbox, moved in at once
                shutil.copyfile(onnx, staging / f"b{i:03d}.onnx")
                (staging / f"b{i:03d}.yml").write_text(yaml.safe_dump(manifest))
            t0 = time.monotonic()
            for path in sorted(staging.iterdir(), key=lambda p: p.suffix != ".onnx"):
                path.rename(d.inbox / path.name)
            while len(list((d.outbox / "status").glob("b*.json"))) < n:
                time.sleep(0.005)
            claimed = time.monotonic() - t0
            rss = rss_mb(d.proc.pid)
        finally:
            d.stop()
            d.close()
        return {"drops": n, "all_claimed_s": claimed, "rss_mb_after_burst": rss}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle(seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        d = Daemon(config(root)).start()
        try:
            time.sleep(2)
            c0, t0 = cpu_seconds(d.proc.pid), time.monotonic()
            time.sleep(seconds)
            c1, t1 = cpu_seconds(d.proc.pid), time.monotonic()
            rss = rss_mb(d.proc.pid)
        finally:
            d.signal(signal.SIGTERM)
            d.close()
        return {"seconds": seconds, "cpu_percent": 100 * (c1 - c0) / (t1 - t0), "rss_mb": rss}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "settle_s": SETTLE,
                               "date": time.strftime("%Y-%m-%d", time.gmtime())}
    for mode in ("events", "poll"):
        for sha in (False, True):
            lat = claim_latency(mode, sha, args.runs)
            results[f"claim_{mode}_{'sha256' if sha else 'settle'}_s"] = {"median": statistics.median(lat), "max": max(lat)}
    results["overhead"] = overhead(args.runs)
    results["burst"] = burst(100)
    results["idle"] = idle(args.idle_seconds)
    results["cache_hit"] = cache_hit(args.runs)
    import overhead as whole_job  # bench/overhead.py: it imports this module's helpers

    results["whole_job"] = whole = whole_job.measure(10, args.runs)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    rows = [("claim latency, events, settle", results["claim_events_settle_s"]["median"], f"<= settle_s + 0.2 = {SETTLE + 0.2}"),
            ("claim latency, events, sha256", results["claim_events_sha256_s"]["median"], "<= 0.1"),
            ("claim latency, poll (1 s), settle", results["claim_poll_settle_s"]["median"], "poll + settle"),
            ("claim latency, poll (1 s), sha256", results["claim_poll_sha256_s"]["median"], "<= poll"),
            ("5 pegasus steps via daemon (s)", results["overhead"]["daemon_steps_s"], ""),
            ("same 5 execs bare (s)", results["overhead"]["bare_execs_s"], ""),
            ("overhead ratio", results["overhead"]["ratio"], "<= 1.5"),
            ("whole job, prep-ahead off (s/job)", whole["ahead_off"]["per_job_s"], ""),
            ("whole job, prep-ahead on (s/job)", whole["ahead_on"]["per_job_s"], ""),
            ("same 5 execs bare, whole-job run (s)", whole["ahead_on"]["bare_execs_s"], ""),
            ("whole-job ratio, prep-ahead off", whole["ahead_off"]["ratio"], ""),
            ("whole-job ratio, prep-ahead on", whole["ahead_on"]["ratio"], "<= 1.5"),
            ("100 drops all claimed (s)", results["burst"]["all_claimed_s"], "<= 5"),
            (f"idle CPU over {args.idle_seconds:.0f} s (%)", results["idle"]["cpu_percent"], "< 1"),
            ("RSS idle (MB)", results["idle"]["rss_mb"], "< 120"),
            ("RSS after burst (MB)", results["burst"]["rss_mb_after_burst"], "< 120"),
            ("cache hit: drop -> succeeded (s)", results["cache_hit"]["drop_to_succeeded_s"], "<= 1"),
            ("cache hit: submit --wait (s)", results["cache_hit"]["submit_wait_s"], "<= 1.5")]
    print(f"{'measure':<40} {'value':>9}  target")
    for label, value, target in rows:
        print(f"{label:<40} {value:>9.3f}  {target}")
    print(f"\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

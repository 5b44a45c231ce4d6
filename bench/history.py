"""Benchmark of a long-lived daemon (not a test): costs with 0, 10k and 100k finished jobs (ops surfaces on) and a
5,000-drop cache-hit burst. Prints a table and writes bench/history.json.

    .venv/bin/python bench/history.py [--sizes 0,10000,100000] [--burst 5000] [--burst-seconds 300]

The history is generated straight into the Store and the outbox layout (rows, status files, logs, bundles), ended
over the last 30 days; retention keeps 90 days, so nothing is pruned and every run starts from the same state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).parent))
from harness import Daemon  # noqa: E402

from bench import cpu_seconds, inputs, rss_mb  # noqa: E402
from saigeedged import config as configmod  # noqa: E402
from saigeedged import jobid  # noqa: E402
from saigeedged.adapters.outbox import status_doc  # noqa: E402
from saigeedged.adapters.store import Store  # noqa: E402
from saigeedged.compile.inputs import sha256_file  # noqa: E402
from saigeedged.jobs import FAILED, SUCCEEDED, Job, entry_to_doc  # noqa: E402
from saigeedged.manifest import build_entry  # noqa: E402
from saigeedged.service.ops import Ops  # noqa: E402

BUILDS_PER_NAME = 100
TEAMS = 10
SPREAD_DAYS = 30
IDLE_S = 10.0
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def history_config(root: Path, ops: bool = True, **extra: Any) -> Path:
    data: dict[str, Any] = {"inbox": str(root / "inbox"), "outbox": str(root / "outbox"), "state_dir": str(root / "state"),
                            "allowed_roots": [str(root / "data")], "log": {"format": "json"},
                            "watch": {"settle_s": 1.0, "poll_interval_s": 1.0}, "defaults": {"target": "host"}}
    if ops:
        data.update(metrics={"listen": f"127.0.0.1:{free_port()}", "textfile": str(root / "state" / "metrics.prom")},
                    dashboard=True, retention={"max_age_days": 90, "keep_last_per_name": 5})
    data.update(extra)
    path = root / "saigeedged.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def template(root: Path) -> Job:
    """A succeeded host job as the daemon leaves it (a report, an attempt, a cache record, a bundle)."""
    entry = build_entry(root / "det.yml", {"task": "detection", "num_classes": 3, "calib": "val.json", "target": "host"},
                        "det", drop=True)
    report = {"outputs": {f"output{i}": {"cosine": 0.999 - i / 1000, "max_abs_error": 0.01 * i, "flagged": False}
                          for i in range(3)}, "flagged": [], "threshold": 0.99}
    return Job(job_id="", name="det", target="host", task="detection", entry=entry_to_doc(entry), subdir="",
               claim_dir=str(root / "inbox" / ".saigeedged" / "claimed" / "x"), manifest="det.yml", state=SUCCEEDED,
               step="publish", step_index=6, step_count=6, onnx_sha256="ab" * 32, calib_samples=16, report=report,
               cache={"hit": False, "key": "cd" * 32, "source_job_id": None},
               attempts=[{"engine": "host", "started_at": "", "finished_at": "", "error": None}])


def generate(root: Path, n: int) -> float:
    """n final jobs (1 in 10 failed) in the Store and the outbox; returns the seconds it took."""
    t0 = time.monotonic()
    store = Store(root / "state" / "saigeedged.db")
    out = root / "outbox"
    for folder in ("status", "logs", *(f"team{t}" for t in range(TEAMS))):
        (out / folder).mkdir(parents=True, exist_ok=True)
    base, now = template(root), jobid.utc_now()
    for i in range(n):
        ended = now - timedelta(days=SPREAD_DAYS * (n - i) / max(n, 1))
        name, subdir = f"det{i // BUILDS_PER_NAME % max(1, n // BUILDS_PER_NAME)}", f"team{i % TEAMS}"
        job = Job.from_doc(base.to_doc())
        job.job_id, job.name, job.subdir = jobid.new(name, ended), name, subdir
        job.created_at = job.started_at = jobid.iso(ended - timedelta(seconds=40))
        job.finished_at = job.updated_at = jobid.iso(ended)
        job.attempts[0].update(started_at=job.started_at, finished_at=job.finished_at)
        if i % 10 == 9:
            job.state, job.bundle = FAILED, None
            job.error = {"code": "CALIB_INVALID", "message": "val.json: no images", "hint": "", "step": "calib"}
        else:
            job.bundle = {"path": f"{subdir}/{name}.host.{job.job_id[-22:]}.saigeedge", "sha256": "ef" * 32, "bytes": 6}
            (out / job.bundle["path"]).write_bytes(b"bundle")
        store.add(job)
        (out / "status" / f"{job.job_id}.json").write_text(json.dumps(status_doc(job), indent=1))
        (out / "logs" / f"{job.job_id}.log").write_text("### validate\n### calib\n### quantize\n### publish\n")
    store.close()
    return time.monotonic() - t0


def timed(argv: list[str], cwd: Path, check: bool = True) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, cwd=cwd, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0


def started(cfg: Path) -> tuple[Daemon, float]:
    d = Daemon(cfg)
    t0 = time.monotonic()
    d.start(ready_timeout=300)
    return d, time.monotonic() - t0


def scrape(cfg: Path) -> float:
    listen = yaml.safe_load(cfg.read_text())["metrics"]["listen"]
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://{listen}/metrics", timeout=120) as answer:
        answer.read()
    return time.monotonic() - t0


def dashboard_write(cfg: Path, times: int = 5) -> dict[str, float]:
    """Page writes as the ops thread makes them, in this process (the daemon is stopped): the first, then the median
    of `times` (the page is fsync'ed with its folder: on a shared disk that, not the history, is most of a write) and
    the median of the page's queries alone."""
    config = configmod.load(cfg)
    store = Store(config.state_dir / "saigeedged.db")
    ops = Ops(config, store)
    writes, views = [], []
    for _ in range(times):
        t0 = time.monotonic()
        ops.write_page()
        writes.append(time.monotonic() - t0)
        t0 = time.monotonic()
        ops.view()
        views.append(time.monotonic() - t0)
    store.close()
    return {"first_dashboard_write_s": writes[0], "dashboard_write_s": statistics.median(writes),
            "dashboard_view_s": statistics.median(views)}


def history(n: int, work: Path) -> dict[str, float]:
    root = work / f"h{n}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    made = generate(root, n)
    cfg = history_config(root)
    d, first_start = started(cfg)  # the first start after an upgrade may build indexes: said apart
    d.stop()
    d.close()
    d, start = started(cfg)
    res: dict[str, float] = {"jobs": n, "generate_s": made, "first_start_s": first_start, "start_s": start}
    try:
        res["first_scrape_s"] = scrape(cfg)
        page = Path(yaml.safe_load(cfg.read_text())["outbox"]) / "index.html"
        deadline = time.monotonic() + 300
        while not (page.exists() and d.events("retention.done")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        assert d.proc is not None
        res["rss_mb"] = rss_mb(d.proc.pid)
        c0, t0 = cpu_seconds(d.proc.pid), time.monotonic()
        time.sleep(IDLE_S)
        res["idle_cpu_percent"] = 100 * (cpu_seconds(d.proc.pid) - c0) / (time.monotonic() - t0)
        res["rss_mb_after_idle"] = rss_mb(d.proc.pid)
        res["scrape_s"] = scrape(cfg)
        res["status_s"] = timed([PYTHON, "-m", "saigeedged", "status", "-c", str(cfg)], Path.cwd())
        res["status_job_s"] = timed([PYTHON, "-m", "saigeedged", "status", "det0", "-c", str(cfg)], Path.cwd(),
                                    check=n > 0)  # no such job at 0: the same lookup, answered "no job"
        res["prune_dry_run_s"] = timed([PYTHON, "-m", "saigeedged", "prune", "--dry-run", "-c", str(cfg)], Path.cwd())
    finally:
        d.stop()
        d.close()
    res.update(dashboard_write(cfg))
    shutil.rmtree(root, ignore_errors=True)
    return res


def counts(db: Path) -> tuple[int, int]:
    """(rows, succeeded rows), read as `status` would (another process, WAL)."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            total = con.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
            done = con.execute("SELECT COUNT(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0]
        finally:
            con.close()
        return int(total), int(done)
    except sqlite3.Error:
        return 0, 0


def burst(n: int, seconds: float, work: Path, window_s: float = 30.0) -> dict[str, Any]:
    """n identical host drops (all but the first are cache hits) moved into the inbox at once."""
    root = work / "burst"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    onnx, manifest = inputs(root)
    manifest["sha256"] = sha256_file(onnx)
    cfg = history_config(root)
    d, _ = started(cfg)
    db = root / "state" / "saigeedged.db"
    try:
        staging = root / "staging"
        staging.mkdir()
        text = yaml.safe_dump(manifest)
        for i in range(n):
            shutil.copyfile(onnx, staging / f"b{i:05d}.onnx")
            (staging / f"b{i:05d}.yml").write_text(text)
        for path in sorted(staging.iterdir(), key=lambda p: p.suffix != ".onnx"):
            path.rename(d.inbox / path.name)
        t0 = time.monotonic()
        while counts(db)[0] == 0:
            time.sleep(0.02)
        first_claim = time.monotonic() - t0
        samples = [(0.0, 0)]
        while samples[-1][1] < n and samples[-1][0] < seconds:
            time.sleep(1.0)
            samples.append((time.monotonic() - t0, counts(db)[1]))
        assert d.proc is not None
        rss, cpu = rss_mb(d.proc.pid), cpu_seconds(d.proc.pid)
    finally:
        d.stop(timeout=60)
        d.close()
    per_job = job_times(db, window_s)
    shutil.rmtree(root, ignore_errors=True)
    return {"drops": n, "first_claim_s": first_claim, "succeeded": samples[-1][1], "elapsed_s": samples[-1][0],
            "rss_mb": rss, "daemon_cpu_s": cpu, "windows_jobs_per_s": windows(samples, window_s), **per_job}


def job_times(db: Path, width: float) -> dict[str, list[float]]:
    """Per window of `width` s (by end, from the first end): the median seconds a job ran (its attempt's start to
    end: the worker's cost of one job) and the median gap before it (the previous end to its start: taking the
    next job). A cost that grows with the queue or the history shows as a rising median."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute("SELECT json_extract(doc, '$.started_at'), json_extract(doc, '$.finished_at') FROM jobs "
                           "WHERE state = 'succeeded' ORDER BY 2").fetchall()
    finally:
        con.close()
    spans = sorted(((seconds_of(a), seconds_of(b)) for a, b in rows if a and b), key=lambda span: span[1])
    runs: list[list[float]] = []
    gaps: list[list[float]] = []
    for i, (start, end) in enumerate(spans[1:], 1):  # the first job compiles for real
        k = int((end - spans[0][1]) // width)
        while len(runs) <= k:
            runs.append([])
            gaps.append([])
        runs[k].append(end - start)
        gaps[k].append(max(0.0, start - spans[i - 1][1]))
    return {"windows_job_s": [round(statistics.median(r), 3) if r else 0.0 for r in runs],
            "windows_gap_s": [round(statistics.median(g), 3) if g else 0.0 for g in gaps]}


def seconds_of(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def windows(samples: list[tuple[float, int]], width: float) -> list[float]:
    """Jobs/s in consecutive windows of `width` seconds, from the first success on (the first compile is real)."""
    start = next((i for i, (_, done) in enumerate(samples) if done > 0), len(samples))
    rates, i = [], start
    while i < len(samples):
        j = next((k for k in range(i, len(samples)) if samples[k][0] - samples[i][0] >= width), None)
        if j is None:
            break
        rates.append(round((samples[j][1] - samples[i][1]) / (samples[j][0] - samples[i][0]), 2))
        i = j
    return rates


def table(results: dict[str, Any]) -> str:
    rows = [("measure", *(f"{h['jobs']} jobs" for h in results["history"]))]
    for key, label in (("first_start_s", "first start to READY=1 (s)"), ("start_s", "start to READY=1 (s)"),
                       ("rss_mb", "RSS after start (MB)"), ("rss_mb_after_idle", "RSS after idle (MB)"),
                       ("idle_cpu_percent", f"idle CPU over {IDLE_S:.0f} s (%)"),
                       ("first_scrape_s", "first /metrics scrape (s)"), ("scrape_s", "later /metrics scrape (s)"),
                       ("status_s", "`saigeedged status` (s)"), ("status_job_s", "`saigeedged status NAME` (s)"),
                       ("first_dashboard_write_s", "first dashboard write (s)"),
                       ("dashboard_write_s", "a dashboard write, median (s)"),
                       ("dashboard_view_s", "its queries, median (s)"), ("prune_dry_run_s", "`prune --dry-run` (s)")):
        rows.append((label, *(f"{h[key]:.3f}" for h in results["history"])))
    lines = [f"{r[0]:<34}" + "".join(f"{c:>14}" for c in r[1:]) for r in rows]
    if "burst" in results:
        b = results["burst"]
        lines += ["", f"burst of {b['drops']} cache-hit drops: first claim {b['first_claim_s']:.2f} s, "
                  f"{b['succeeded']} succeeded in {b['elapsed_s']:.0f} s, RSS {b['rss_mb']:.1f} MB",
                  f"  jobs/s per 30 s window: {b['windows_jobs_per_s']}",
                  f"  median job (start to end, s) per window: {b['windows_job_s']}",
                  f"  median gap before a job (s) per window: {b['windows_gap_s']}",
                  f"  daemon CPU over the burst: {b['daemon_cpu_s']:.0f} s"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="0,10000,100000")
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--burst-seconds", type=float, default=300.0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "history.json"))
    parser.add_argument("--work", default=None, help="a folder for the generated state (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        results: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "history": []}
        for n in (int(s) for s in args.sizes.split(",") if s):
            results["history"].append(history(n, work))
            print(json.dumps(results["history"][-1]), flush=True)
        if args.burst:
            results["burst"] = burst(args.burst, args.burst_seconds, work)
            print(json.dumps(results["burst"]), flush=True)
    print(table(results))
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

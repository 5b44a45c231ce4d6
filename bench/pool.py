"""Benchmark of the engine pool (SPEC §11; not a test): 30 jobs whose quantize step sleeps 2 s on one engine against
three (the local engine + the tcp+TLS and ssh test engines of tests/enginehosts.py), and what a remote engine costs
per job (put/get_archive of 100 calibration images; one 100-image job on each engine alone). Prints a table and
writes bench/pool.json.

    .venv/bin/python bench/pool.py [--jobs 30] [--sleep 2] [--images 100]

Needs root, the stand-in images and what scripts/setup-host installs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).parent))
import docker  # noqa: E402
from conftest import IMAGES, STANDIN_ACUITY, build_standins  # noqa: E402
from enginehosts import EngineHosts, EngineSpec, started_engines  # noqa: E402
from engines import calibration_tar, transfer  # noqa: E402
from harness import Daemon, drop, wait_for  # noqa: E402

from saigeedged.cli import examples  # noqa: E402

IMAGE = "saigeedged-standin/acuity:bench-pool"  # built from this checkout: the sleepN knob of its pegasus stand-in
LOCAL = {"name": "local", "url": "unix:///var/run/docker.sock", "targets": ["cubie"]}
ENGINES = tuple(EngineSpec(name, tls=name == "tls", ssh=name == "ssh", images=(IMAGE, STANDIN_ACUITY)) for name in ("tls", "ssh"))


def engine_entries(hosts: EngineHosts, names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [LOCAL if name == "local" else {**hosts[name].config_entry(name), "targets": ["cubie"]} for name in names]


class Pool:
    """A daemon on a temp root whose cubie jobs run on `names`; its containers are removed on close."""

    def __init__(self, hosts: EngineHosts, names: tuple[str, ...], root: Path, data: Path) -> None:
        self.hosts, self.names, self.container = hosts, names, f"saige-bench-pool-{uuid.uuid4().hex[:8]}"
        data = {"inbox": str(root / "inbox"), "outbox": str(root / "outbox"), "state_dir": str(root / "state"),
                "allowed_roots": [str(data)], "log": {"format": "json"},
                "watch": {"settle_s": 0.3, "rescan_interval_s": 60}, "defaults": {"target": "cubie"},
                "cubie": {"image": IMAGE, "container": self.container}, "limits": {"step_timeout_s": 600},
                "engines": engine_entries(hosts, names)}
        root.mkdir()
        config = root / "saigeedged.yml"
        config.write_text(yaml.safe_dump(data))
        self.daemon = Daemon(config, {"HOME": str(hosts["ssh"].ssh.home)} if "ssh" in names and hosts["ssh"].ssh else None)

    def __enter__(self) -> Daemon:
        return self.daemon.start()

    def __exit__(self, *exc: object) -> None:
        self.daemon.stop()
        self.daemon.close()
        clients = [docker.from_env(), *(self.hosts[n].client() for n in self.names if n != "local")]
        for client in clients:
            with contextlib.suppress(docker.errors.NotFound):
                client.containers.get(self.container).remove(force=True)
            client.close()


def seconds(doc: dict[str, Any], start: str, end: str) -> float:
    return (datetime.fromisoformat(doc[end]) - datetime.fromisoformat(doc[start])).total_seconds()


def run_jobs(d: Daemon, onnx: Path, manifest: dict[str, Any], names: list[str]) -> tuple[float, list[dict[str, Any]]]:
    """Drop every job at once; seconds from the first compile's start to the last end, and the final statuses."""
    for name in names:
        drop(d.inbox, name, onnx, {**manifest, "cache": False})
    docs = [d.wait_job(name, timeout=1800) for name in names]
    failed = [doc["job_id"] for doc in docs if doc["state"] != "succeeded"]
    assert not failed, f"jobs failed: {failed}\n{d.stderr()[-3000:]}"
    first = min(datetime.fromisoformat(doc["started_at"]) for doc in docs)
    last = max(datetime.fromisoformat(doc["finished_at"]) for doc in docs)
    return (last - first).total_seconds(), docs


def throughput(hosts: EngineHosts, root: Path, jobs: int, sleep: int) -> dict[str, Any]:
    """`jobs` jobs whose quantize sleeps `sleep` s, on local alone and on local + tls + ssh."""
    root.mkdir(parents=True)
    onnx = examples.yolox(root / "det.onnx", 3, (64, 64))
    calib = examples.valjson(root / "data", examples.random_labels(8, 3))
    manifest = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": 4}
    result: dict[str, Any] = {"jobs": jobs, "quantize_sleep_s": sleep}
    for names in (("local",), ("local", "tls", "ssh")):
        with Pool(hosts, names, root / "-".join(names), root / "data") as d:
            wall, docs = run_jobs(d, onnx, manifest, [f"p{len(names)}e{i:02d}_sleep{sleep}" for i in range(jobs)])
        spread = {name: sum(doc["engine"] == name for doc in docs) for name in names}
        job_s = {name: round(statistics.median(seconds(doc, "started_at", "finished_at") for doc in docs
                                               if doc["engine"] == name), 2) for name in names if spread[name]}
        result[f"{len(names)}_engines"] = {"wall_s": round(wall, 2), "jobs_per_min": round(60 * jobs / wall, 1),
                                           "spread": spread, "median_job_s": job_s}
    result["ratio"] = round(result["1_engines"]["wall_s"] / result["3_engines"]["wall_s"], 2)
    return result


def job_cost(hosts: EngineHosts, root: Path, images: int, runs: int) -> dict[str, Any]:
    """Median seconds of one job with `images` calibration images (quantize costs nothing) on each engine alone."""
    root.mkdir(parents=True)
    onnx = examples.yolox(root / "det.onnx", 3, (64, 64))
    calib = examples.valjson(root / "data", examples.random_labels(images, 3))
    for i, path in enumerate(sorted((root / "data" / "images").iterdir())):  # camera-sized JPEGs
        examples.image(path, seed=i, size=(544, 960), grey=128)
    manifest = {"task": "detection", "num_classes": 3, "calib": str(calib), "n_samples": images}
    mb = sum(p.stat().st_size for p in (root / "data" / "images").iterdir()) / 1e6
    result: dict[str, Any] = {"images": images, "calib_MB": round(mb, 1)}
    for name in ("local", "tls", "ssh"):
        with Pool(hosts, (name,), root / name, root / "data") as d:
            _, docs = run_jobs(d, onnx, manifest, [f"cost{name}{i}" for i in range(runs)])
        result[name] = round(statistics.median(seconds(doc, "started_at", "finished_at") for doc in docs), 2)
    return result


def archive_cost(hosts: EngineHosts, images: int, repeat: int) -> dict[str, Any]:
    """put/get_archive of `images` 150 kB files (a JPEG's size at 544x960) over tcp+TLS and ssh."""
    data = calibration_tar(images, 150_000)
    out: dict[str, Any] = {"payload_MB": round(len(data) / 1e6, 1)}
    for via in ("tls", "ssh"):
        with contextlib.closing(hosts[via].client(via, timeout=300)) as client:
            out[via] = transfer(client, data, repeat)
    return out


def table(results: dict[str, Any]) -> list[tuple[str, Any, str]]:
    t, c, a = results["throughput"], results["job_cost"], results["archive"]
    n, s = t["jobs"], t["quantize_sleep_s"]
    return [(f"{n} jobs, quantize {s} s, 1 engine (s)", t["1_engines"]["wall_s"], f">= {n * s}"),
            (f"{n} jobs, quantize {s} s, 3 engines (s)", t["3_engines"]["wall_s"], f"spread {t['3_engines']['spread']}"),
            ("  median job (s) by engine", "", f"{t['1_engines']['median_job_s']} alone, {t['3_engines']['median_job_s']}"),
            ("throughput ratio 3 vs 1 engine", t["ratio"], ">= 2.7"),
            (f"put_archive {a['payload_MB']} MB, tcp+TLS (s)", a["tls"]["put_s"], f"{a['tls']['put_MBps']} MB/s"),
            (f"get_archive {a['payload_MB']} MB, tcp+TLS (s)", a["tls"]["get_s"], f"{a['tls']['get_MBps']} MB/s"),
            (f"put_archive {a['payload_MB']} MB, ssh (s)", a["ssh"]["put_s"], f"{a['ssh']['put_MBps']} MB/s"),
            (f"get_archive {a['payload_MB']} MB, ssh (s)", a["ssh"]["get_s"], f"{a['ssh']['get_MBps']} MB/s"),
            (f"job with {c['images']} images ({c['calib_MB']} MB), local (s)", c["local"], "bind mount"),
            (f"job with {c['images']} images, tcp+TLS (s)", c["tls"], f"+{c['tls'] - c['local']:.2f} s copying"),
            (f"job with {c['images']} images, ssh (s)", c["ssh"], f"+{c['ssh'] - c['local']:.2f} s copying")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--sleep", type=int, default=2)
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--throughput-only", action="store_true", help="skip the copy costs (e.g. with a longer --sleep)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "pool.json")
    args = parser.parse_args()
    host = docker.from_env()
    build_standins(host)
    subprocess.run([str(IMAGES / "build.sh"), IMAGE, str(IMAGES / "common"), str(IMAGES / "acuity")], check=True,
                   stdout=subprocess.DEVNULL)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d", time.gmtime())}
    with started_engines(host, ENGINES) as hosts, tempfile.TemporaryDirectory(prefix="saige-bench-pool-") as tmp:
        wait_for(lambda: all(hosts[n].client().ping() for n in ("tls", "ssh")), 30, "the test engines")
        results["throughput"] = throughput(hosts, Path(tmp) / "throughput", args.jobs, args.sleep)
        print(json.dumps(results["throughput"]), file=sys.stderr, flush=True)  # a later failure keeps this figure
        if args.throughput_only:
            return 0
        results["archive"] = archive_cost(hosts, args.images, args.runs)
        results["job_cost"] = job_cost(hosts, Path(tmp) / "cost", args.images, args.runs)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"{'measure':<44} {'value':>8}  note")
    for name, value, note in table(results):
        print(f"{name:<44} {value:>8}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of executor slurm (docs/spec-executor-slurm.md; not a test): 30 jobs whose quantize sleeps 10 s on 1, 2
and 3 nodes of the test cluster (tests/slurmcluster.py: node containers from Debian packages, the daemon on the
first), and the latency the Slurm path adds to one job against the local engine (the same daemon, node and stand-in
image, `executor: local`). Prints a table and writes bench/slurm.json.

    .venv/bin/python bench/slurm.py [--jobs 30] [--sleep 10] [--runs 5]

Needs root, docker, mmdebstrap (scripts/setup-host). The CPU is shared: the load average is recorded with each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
import docker  # noqa: E402
from conftest import STANDIN_ACUITY, STANDIN_MOBILINT, build_standins  # noqa: E402
from slurmcluster import Cluster  # noqa: E402
from slurmdaemon import ClusterDaemon  # noqa: E402

from saigeedged.executor import feature  # noqa: E402

NO_GATE = {"min_cosine": 0.0, "max_map_drop": 1.0}  # the seeded stand-in models are timed, not judged (SPEC §17)


def seconds(doc: dict[str, Any], start: str, end: str) -> float:
    return (datetime.fromisoformat(doc[end]) - datetime.fromisoformat(doc[start])).total_seconds()


def using(cluster: Cluster, count: int) -> None:
    """Only the first `count` nodes take jobs: the others are drained."""
    for n, node in enumerate(cluster.nodes.values(), 1):
        cluster.drain(node, n > count)


def throughput(cluster: Cluster, jobs: int, sleep: int) -> dict[str, Any]:
    """`jobs` jobs dropped at once on 1, 2, 3 nodes: wall seconds from the first start to the last end."""
    result: dict[str, Any] = {"jobs": jobs, "quantize_sleep_s": sleep}
    for count in (1, 2, 3):
        using(cluster, count)
        d = ClusterDaemon(cluster).start()
        names = [f"t{count}n{i:02d}_sleep{sleep}" for i in range(jobs)]
        for name in names:
            d.drop(name, cache=False, accuracy=NO_GATE)
        docs = [d.job(name, timeout=60 * jobs) for name in names]
        d.stop()
        failed = [(doc["job_id"], doc["state"], doc["error"]) for doc in docs if doc["state"] != "succeeded"]
        assert not failed, failed
        wall = (max(datetime.fromisoformat(x["finished_at"]) for x in docs)
                - min(datetime.fromisoformat(x["started_at"]) for x in docs)).total_seconds()
        spread: dict[str, int] = {}
        for placed in d.events("job.placed"):
            spread[placed["node"]] = spread.get(placed["node"], 0) + 1
        result[f"{count}_nodes"] = {"wall_s": round(wall, 1), "jobs_per_min": round(60 * jobs / wall, 2),
                                    "spread": spread, "load": os.getloadavg()[0]}
        print(json.dumps({f"{count}_nodes": result[f"{count}_nodes"]}), file=sys.stderr, flush=True)
    using(cluster, 3)
    result["per_node_added"] = [round(result[f"{n}_nodes"]["jobs_per_min"] - result[f"{n - 1}_nodes"]["jobs_per_min"], 2)
                                for n in (2, 3)]
    return result


def latency(cluster: Cluster, runs: int) -> dict[str, Any]:
    """One job at a time (quantize instant) on one node: median seconds from its start to its end, local vs slurm."""
    using(cluster, 1)
    out: dict[str, Any] = {"runs": runs}
    for kind in ("local", "slurm"):
        d = ClusterDaemon(cluster, **({"executor": {"kind": "local"}} if kind == "local" else {})).start()
        times = []
        for i in range(runs):
            d.drop(f"lat{kind}{i}", cache=False, accuracy=NO_GATE)
            doc = d.job(f"lat{kind}{i}")
            assert doc["state"] == "succeeded", d.tail()
            times.append(seconds(doc, "started_at", "finished_at"))
        d.stop()
        out[kind] = {"median_job_s": round(statistics.median(times), 2), "load": os.getloadavg()[0]}
    out["added_s"] = round(out["slurm"]["median_job_s"] - out["local"]["median_job_s"], 2)
    using(cluster, 3)
    return out


def table(results: dict[str, Any]) -> list[tuple[str, Any, str]]:
    t, lat = results["throughput"], results["latency"]
    n, s = t["jobs"], t["quantize_sleep_s"]
    rows = [(f"{n} jobs, quantize {s} s, {c} node(s) (s)", t[f"{c}_nodes"]["wall_s"],
             f"{t[f'{c}_nodes']['jobs_per_min']} jobs/min, spread {t[f'{c}_nodes']['spread']}, "
             f"load {t[f'{c}_nodes']['load']:.1f}") for c in (1, 2, 3)]
    rows.append(("jobs/min added by node 2, node 3", "", str(t["per_node_added"])))
    rows += [("one job, local engine (s)", lat["local"]["median_job_s"], f"median of {lat['runs']}"),
             ("one job, executor slurm (s)", lat["slurm"]["median_job_s"], f"+{lat['added_s']} s: sbatch, schedule, "
              "agent start, steps by files on the share")]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--sleep", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "slurm.json")
    args = parser.parse_args()
    build_standins(docker.from_env())
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="saige-bench-slurm-") as tmp:
        cluster = Cluster(Path(tmp), [feature(STANDIN_ACUITY), feature(STANDIN_MOBILINT)],
                          [STANDIN_ACUITY, STANDIN_MOBILINT])
        try:
            cluster.start(3)
            results["latency"] = latency(cluster, args.runs)
            print(json.dumps(results["latency"]), file=sys.stderr, flush=True)
            results["throughput"] = throughput(cluster, args.jobs, args.sleep)
        finally:
            cluster.teardown()
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"{'measure':<44} {'value':>8}  note")
    for name, value, note in table(results):
        print(f"{name:<44} {value:>8}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

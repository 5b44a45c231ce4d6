"""executor: slurm against a real Slurm cluster of three node containers (tests/slurmcluster.py): the daemon runs on
the first node (the controller), container steps on whichever node Slurm places each attempt."""

from __future__ import annotations

import json
import subprocess
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import STANDIN_ACUITY, STANDIN_MOBILINT
from factory import random_labels, valjson, yolox
from harness import drop, read_status, wait_for
from slurmcluster import ROOT, Cluster, Node, slurm_cluster  # noqa: F401 - the session fixture

pytestmark = [pytest.mark.slurm, pytest.mark.docker]
PYTHON = ROOT / ".venv" / "bin" / "python"
CUBIE, MOBILINT = "saige-slurm-cubie", "saige-slurm-mobilint"


class ClusterDaemon:
    """`saigeedged run` with executor slurm on the controller node; its folders are on the share."""

    def __init__(self, cluster: Cluster, **overrides: Any) -> None:
        self.cluster, self.node = cluster, cluster.controller
        self.root = cluster.share / uuid.uuid4().hex[:8]
        self.inbox, self.outbox, self.data = self.root / "inbox", self.root / "outbox", self.root / "data"
        self.config = self.root / "saigeedged.yml"
        self.calib = valjson(self.data, random_labels(8, 3))
        doc: dict[str, Any] = {
            "inbox": str(self.inbox), "outbox": str(self.outbox), "state_dir": str(self.root / "state"),
            "allowed_roots": [str(self.data)], "watch": {"settle_s": 0.3, "mode": "poll", "poll_interval_s": 0.5},
            "log": {"format": "json"}, "defaults": {"target": "cubie"},
            "cubie": {"image": STANDIN_ACUITY, "container": CUBIE},
            "mobilint": {"image": STANDIN_MOBILINT, "container": MOBILINT},
            "limits": {"step_timeout_s": 300},
            "executor": {"kind": "slurm", "partition": "saige", "work_share": str(self.root / "work"),
                         "poll_interval_s": 1.0}}
        doc.update(overrides)
        self.root.mkdir(parents=True, exist_ok=True)
        self.config.write_text(yaml.safe_dump(doc))
        self.pidfile, self.err = self.root / "daemon.pid", self.root / "daemon.err"

    def start(self) -> ClusterDaemon:
        self.node.sh(f"cd {self.root} && (sh -c 'echo $$ > {self.pidfile}; exec {PYTHON} -m saigeedged run "
                     f"-c {self.config}' >> {self.err} 2>&1 &)")
        wait_for(lambda: any(e.get("event") == "daemon.ready" for e in self.events()), 60, "daemon.ready")
        return self

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        try:
            lines = self.err.read_text().splitlines()
        except FileNotFoundError:
            return []
        docs = [json.loads(x) for x in lines if x.startswith("{")]
        return [d for d in docs if name is None or d.get("event") == name]

    def signal(self, sig: str) -> None:
        self.node.sh(f"kill -{sig} $(cat {self.pidfile})")

    def stop(self) -> None:
        self.node.sh(f"p=$(cat {self.pidfile}); kill -TERM $p 2>/dev/null; "
                     "for _ in $(seq 300); do kill -0 $p 2>/dev/null || exit 0; sleep 0.1; done; kill -9 $p", check=False)

    def drop(self, name: str, **fields: Any) -> None:
        manifest = {"task": "detection", "num_classes": 3, "calib": str(self.calib), "n_samples": 4, **fields}
        drop(self.inbox, name, yolox(self.data / f"{name}.onnx", size=(64, 64), seed=zlib.crc32(name.encode())),
             manifest)

    def job(self, name: str, states: tuple[str, ...] = ("succeeded", "failed", "cancelled"), step: str | None = None,
            timeout: float = 180) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            for path in (self.outbox / "status").glob(f"{name}-*.json"):
                doc = read_status(self.outbox, path.stem)
                if doc and doc["state"] in states and (step is None or doc["step"] == step):
                    return doc
            return None

        return wait_for(find, timeout, f"{name} in {states} {step or ''}\n{self.tail()}")  # type: ignore[no-any-return]

    def tail(self) -> str:
        try:
            return self.err.read_text()[-3000:]
        except FileNotFoundError:
            return ""

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.node.sh(f"{PYTHON} -m saigeedged {' '.join(argv)} -c {self.config}", check=False)


@pytest.fixture
def cluster_daemon(slurm_cluster: Cluster) -> Iterator[Any]:  # noqa: F811 - the session fixture by name
    """Start a daemon on the controller: cluster_daemon(**config overrides); stopped and its cluster jobs ended after."""
    started: list[ClusterDaemon] = []

    def start(**overrides: Any) -> ClusterDaemon:
        started.append(ClusterDaemon(slurm_cluster, **overrides).start())
        return started[-1]

    yield start
    for d in started:
        d.stop()
    slurm_cluster.controller.sh("scancel --user root", check=False)


def calls(node: Node, verb: str) -> list[str]:
    """The stand-in pegasus calls of `verb` in the node's cubie container (cwd, argv)."""
    out = node.sh(f"docker exec {CUBIE} cat /tmp/standin-calls.log", check=False).stdout
    return [line for line in out.splitlines() if f"pegasus.py {verb}" in line]


def running_on(cluster: Cluster, job_id: str) -> Node:
    """The node whose cluster job runs this job's attempt now (squeue)."""
    def find() -> str | None:
        jobs = cluster.json("squeue")["jobs"]
        return next((j["batch_host"] for j in jobs if j["name"] == job_id and j["job_state"] == "RUNNING"), None)

    return cluster.nodes[wait_for(find, 60, f"{job_id} running")]


def test_cluster_runs_a_batch_job_and_teardown_leaves_nothing(tmp_path: Path, docker_client: Any) -> None:
    """A one-node cluster of its own runs an sbatch job with its gres; its teardown leaves no container, network or cgroup."""
    cluster = Cluster(tmp_path, ["img-x"], [STANDIN_ACUITY])
    try:
        cluster.start(1)
        out = cluster.controller.sh(f"cd {tmp_path} && sbatch --parsable --gres=cubie:1 -C img-x "
                                    f"--wrap 'echo ran on $(hostname) restarts=$SLURM_RESTART_COUNT'").stdout.strip()
        log = tmp_path / f"slurm-{out}.out"
        wait_for(lambda: log.exists() and "ran on" in log.read_text(), 60, "the batch job's output")
        assert f"ran on {cluster.controller.name}" in log.read_text()
    finally:
        cluster.teardown()
    assert cluster.leftovers() == []


def test_a_cubie_drop_compiles_on_a_node(cluster_daemon: Any, slurm_cluster: Cluster) -> None:  # noqa: F811
    """A cubie drop publishes its bundle; its pegasus steps ran in a node's container, placed by Slurm."""
    d = cluster_daemon()
    d.drop("first")
    done = d.job("first")
    assert done["state"] == "succeeded", done
    assert (d.outbox / done["bundle"]["path"]).is_file()
    placed = d.events("job.placed")
    assert [e["job_id"] for e in placed] == [done["job_id"]]
    ran = [n for n in slurm_cluster.nodes.values() if any("first" in c for c in calls(n, "quantize"))]
    assert [n.name for n in ran] == [placed[0]["node"]]

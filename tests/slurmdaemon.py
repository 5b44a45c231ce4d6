"""The daemon with executor slurm on a test cluster's controller node (tests/slurmcluster.py), its folders on the share:
used by tests/test_slurm.py and bench/slurm.py."""

from __future__ import annotations

import subprocess
import uuid
import zlib
from typing import Any

import yaml
from conftest import STANDIN_ACUITY, STANDIN_MOBILINT
from factory import random_labels, valjson, yolox
from harness import EventLog, drop, read_status, wait_for
from slurmcluster import ROOT, Cluster

PYTHON = ROOT / ".venv" / "bin" / "python"
CUBIE, MOBILINT = "saige-slurm-cubie", "saige-slurm-mobilint"


class ClusterDaemon:
    """`saigeedged run` with executor slurm on the controller node; its folders are on the share."""

    def __init__(self, cluster: Cluster, **overrides: Any) -> None:
        self.cluster, self.node = cluster, cluster.controller
        self.root = cluster.share / uuid.uuid4().hex[:8]
        # containers of its own: a node's container is owned by the daemon that made it (another one is refused)
        self.cubie, self.mobilint = f"{CUBIE}-{self.root.name}", f"{MOBILINT}-{self.root.name}"
        self.inbox, self.outbox, self.data = self.root / "inbox", self.root / "outbox", self.root / "data"
        self.config = self.root / "saigeedged.yml"
        self.calib = valjson(self.data, random_labels(8, 3))
        doc: dict[str, Any] = {
            "inbox": str(self.inbox), "outbox": str(self.outbox), "state_dir": str(self.root / "state"),
            "allowed_roots": [str(self.data)], "watch": {"settle_s": 0.3, "mode": "poll", "poll_interval_s": 0.5},
            "log": {"format": "json"}, "defaults": {"target": "cubie"},
            "cubie": {"image": STANDIN_ACUITY, "container": self.cubie},
            "mobilint": {"image": STANDIN_MOBILINT, "container": self.mobilint},
            "limits": {"step_timeout_s": 300},
            "executor": {"kind": "slurm", "partition": "saige", "work_share": str(self.root / "work"),
                         "poll_interval_s": 1.0}}
        doc.update(overrides)
        self.root.mkdir(parents=True, exist_ok=True)
        self.config.write_text(yaml.safe_dump(doc))
        self.pidfile, self.err = self.root / "daemon.pid", self.root / "daemon.err"
        self._events = EventLog(self.err)

    def start(self) -> ClusterDaemon:
        before = len(self.events("daemon.ready"))
        self.node.sh(f"cd {self.root} && (sh -c 'echo $$ > {self.pidfile}; exec {PYTHON} -m saigeedged run "
                     f"-c {self.config}' >> {self.err} 2>&1 &)")
        wait_for(lambda: len(self.events("daemon.ready")) > before, 60, "daemon.ready")
        return self

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return self._events.events(name)

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

        try:
            return wait_for(find, timeout, f"{name} in {states} {step or ''}")  # type: ignore[no-any-return]
        except AssertionError as exc:  # what the daemon and the cluster say now, not when the wait began
            raise AssertionError(f"{exc}\n{self.tail()}\n{self.cluster.describe()}") from None

    def tail(self) -> str:
        try:
            return self.err.read_text()[-3000:]
        except FileNotFoundError:
            return ""

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.node.sh(f"{PYTHON} -m saigeedged {' '.join(argv)} -c {self.config}", check=False)

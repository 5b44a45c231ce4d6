"""Where container steps run (SPEC executor section, docs/spec-executor-slurm.md): this host's Docker engine (`local`,
the default) or the nodes of a Slurm partition (`slurm`); the config section, validated at load, and the pure rules
of the cluster executor: a job's Slurm name, its image feature, an attempt's number, a cluster job's state.

Kubernetes would come behind the same interface (`Executor`: submit, poll, cancel, nodes) when a site asks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from saigeedged.errors import SaigeError

KINDS = ("local", "slurm")
HINT = ("see `executor:` in /usr/share/doc/saigeedged/examples/saigeedged.yml (config/saigeedged.yml in the source) "
        "and docs/spec-executor-slurm.md")
ENGINE = "slurm"  # the engine an attempt on the cluster is recorded on (its node is in the job log and the status)
ALIVE = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED",
         "COMPLETING", "STAGE_OUT")
LAUNCH_FAILED = "launch failed requeued held"  # slurmd's requeue of a job it could not start (JOB_LAUNCH_FAILED)


@dataclass(frozen=True)
class ExecutorSpec:
    """The `executor:` section: `work_share` is the work root on every compile host (slurm), None for local."""

    kind: str = "local"
    partition: str = ""
    work_share: Path | None = None
    fast_requeue: bool = True
    max_jobs: int = 16
    poll_interval_s: float = 2.0

    @property
    def slurm(self) -> bool:
        return self.kind == "slurm"


def parse(section: dict[str, Any], base: Path) -> ExecutorSpec:
    """Validate the (type-checked) `executor:` section: slurm needs an absolute work share and a partition."""
    kind = section["kind"]
    if kind not in KINDS:
        raise SaigeError("MANIFEST_INVALID", f"config executor.kind: must be one of {', '.join(KINDS)}, got {kind!r}",
                         hint=HINT)
    if section["max_jobs"] < 1 or section["poll_interval_s"] <= 0:
        raise SaigeError("MANIFEST_INVALID", "config executor.max_jobs and executor.poll_interval_s must be positive",
                         hint=HINT)
    share = section["work_share"]
    if kind == "local":
        return ExecutorSpec(max_jobs=section["max_jobs"], poll_interval_s=float(section["poll_interval_s"]))
    if not share or not Path(share).is_absolute():
        raise SaigeError("MANIFEST_INVALID", f"config executor.work_share: executor slurm needs the absolute path of "
                         f"the work share mounted at the same path on every compile host, got {share!r}",
                         hint="e.g. work_share: /srv/saige/work (NFSv4.1 mounted before slurmd starts); " + HINT)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", section["partition"]):
        raise SaigeError("MANIFEST_INVALID", f"config executor.partition: the Slurm partition of the compile hosts, "
                         f"got {section['partition']!r}", hint="e.g. partition: saige (`sinfo` lists them); " + HINT)
    return ExecutorSpec("slurm", section["partition"], Path(share), bool(section["fast_requeue"]),
                        section["max_jobs"], float(section["poll_interval_s"]))


def feature(image: str) -> str:
    """The Slurm node feature that says a node has `image` loaded: `img-` and the reference with every character
    Slurm's feature expressions give a meaning to replaced (`ubuntu-npu:v2.0.10.1` -> `img-ubuntu-npu_v2.0.10.1`)."""
    return "img-" + re.sub(r"[^A-Za-z0-9_.-]", "_", image)


def minutes(limit_s: int) -> int:
    """Slurm's --time in whole minutes, never below the limit: a job ended by the cluster has outlived its own."""
    return max(1, -(-limit_s // 60) + 1)


def attempt(base: int, restarts: int) -> int:
    """The store's attempt a cluster job runs: the attempt it was submitted for plus Slurm's requeues since."""
    return base + restarts


@dataclass(frozen=True)
class ClusterJob:
    """A job as the cluster sees it (squeue --json): `base` is the store attempt it was submitted for."""

    cluster_id: int
    name: str
    state: str
    restarts: int
    base: int
    node: str = ""
    reason: str = ""
    detail: str = ""  # Slurm's state description, e.g. why it holds the job

    @property
    def alive(self) -> bool:
        return self.state in ALIVE

    @property
    def launch_failed(self) -> bool:
        """Held by Slurm after its node could not launch it (a prolog that failed, a stale copy of the job still on
        the node): it never runs again unless released; the node is drained."""
        return self.state == "PENDING" and self.detail.startswith(LAUNCH_FAILED)

    def describe(self) -> str:
        """State and why, for a message: `PENDING: launch failed requeued held`."""
        why = self.detail or (self.reason if self.reason not in ("", "None") else "")
        return f"{self.state}: {why}" if why else self.state

    @property
    def attempt(self) -> int:
        return attempt(self.base, self.restarts)


@dataclass(frozen=True)
class ClusterNode:
    """A node of the partition (sinfo --json): its state words, its GRES per target, its features."""

    name: str
    state: str
    gres: dict[str, int] = field(default_factory=dict)
    features: tuple[str, ...] = ()
    reason: str = ""

    @property
    def up(self) -> bool:
        words = self.state.lower()
        # a node in a maintenance or other reservation, to reboot, or in error takes no job of ours (PLANNED, held
        # for a job of higher priority for a while, is up: `check` would call it down)
        return not any(w in words for w in ("down", "drain", "fail", "not_responding", "unknown", "future", "maint",
                                            "reserved", "reboot", "error", "invalid"))


def serves(node: ClusterNode, images: dict[str, str]) -> tuple[str, ...]:
    """The targets (of `images`: target -> image) whose GRES and image feature the node has, up or not."""
    return tuple(t for t, image in images.items() if node.gres.get(t) and feature(image) in node.features)


def capacity(nodes: list[ClusterNode], target: str, image: str) -> int:
    """How many jobs of `target` the partition can run at once: one per up node that has the GRES and the image."""
    return sum(1 for n in nodes if n.up and serves(n, {target: image}))


class Executor(Protocol):
    """What the daemon asks of a cluster: Slurm now, Kubernetes when a site asks."""

    def submit(self, name: str, target: str, image: str, base: int, script: str, limit_s: int) -> int:
        """Queue a job for attempt `base` of `name`, ended by the cluster after `limit_s`; its cluster id."""

    def poll(self, name: str) -> list[ClusterJob]:
        """The cluster's jobs of that name (newest last)."""

    def cancel(self, cluster_id: int) -> None:
        """End the job: its step is killed on its node (TERM)."""

    def nodes(self) -> list[ClusterNode]:
        """The partition's nodes."""

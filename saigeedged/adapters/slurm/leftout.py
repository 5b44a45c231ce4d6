"""The nodes this daemon leaves out of its cluster jobs for a while (executor slurm), and the cluster jobs whose agent
has spoken its last word. Shared by the pool's workers and the ops thread; the nodes are kept in
`<state_dir>/slurm-left-out.json` too, so that a restart remembers them and `check` and `status` (other processes)
show them."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import structlog

from saigeedged import files

log = structlog.get_logger()

AVOID_S = 600.0  # how long a node that cannot serve (unfit.py) is left out: for an operator to load the image or mend
# the engine
RETIRED_KEEP_S = 3600.0  # a cluster job whose agent failed is no attempt's any more; forgotten after this (squeue's
# MinJobAge keeps an ended job 300 s by default)
FILE = "slurm-left-out.json"


def path(state_dir: Path) -> Path:
    """Where the daemon keeps the nodes it leaves out."""
    return state_dir / FILE


class Left(NamedTuple):
    """A node left out: for `target` (None: every target) until `until` (the wall clock), and why."""

    node: str
    target: str | None
    why: str
    until: float

    @property
    def of(self) -> str:
        """What it is left out of, in words."""
        return f"left out of {self.target or 'every'} target's jobs"


def current(state_dir: Path, now: float) -> list[Left]:
    """The nodes a daemon with this state dir leaves out at `now`, as it keeps them: read, never written (`check` and
    `status` may run as another user)."""
    return [Left(node, only, why, until) for (node, only), (until, why) in read(path(state_dir)).items() if until > now]


class LeftOut:
    """Nodes left out (per target, or for every target) until a time of `clock` (the wall clock: what `path` keeps
    outlives the process), and retired cluster jobs (memory only). `kept`: the file, None for none; read at start."""

    def __init__(self, clock: Callable[[], float] = time.time, kept: Path | None = None) -> None:
        self.clock, self.kept = clock, kept
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str | None], tuple[float, str]] = {}  # (node, target or None) -> (until, why)
        self._retired: dict[int, float] = {}  # cluster id -> since
        if kept is not None:
            self._nodes = read(kept)

    def avoid(self, node: str, why: str, target: str | None = None) -> None:
        """Leave a node out for AVOID_S: for one target (its image missing, or its cluster job failed before ready)
        or all (None: its engine does not answer)."""
        with self._lock:
            self._nodes[(node, target)] = (self.clock() + AVOID_S, why)
            self._keep()

    def listed(self) -> list[Left]:
        """Every node left out now; the journal says when one is taken back."""
        now = self.clock()
        with self._lock:
            back = [key for key, (until, _) in self._nodes.items() if until <= now]
            for key in back:
                del self._nodes[key]
            if back:
                self._keep()
            left = [Left(node, only, why, until) for (node, only), (until, why) in self._nodes.items()]
        for node, only in back:
            log.info("slurm.node_taken_back", node=node, target=only, after_s=AVOID_S)
        return left

    def avoided(self, target: str | None = None) -> dict[str, str]:
        """The nodes left out now for `target` (None: for any), and why."""
        return {left.node: left.why for left in self.listed() if target is None or left.target in (None, target)}

    def retire(self, cluster_id: int) -> None:
        """A cluster job whose agent said it cannot serve: it may still look alive (RUNNING, COMPLETING) as it ends,
        and must not be taken for the retake's own."""
        now = self.clock()
        with self._lock:
            self._retired = {cid: since for cid, since in self._retired.items() if now - since < RETIRED_KEEP_S}
            self._retired[cluster_id] = now

    def retired(self, cluster_id: int) -> bool:
        """Was this cluster job retired (its agent's error read)?"""
        with self._lock:
            return cluster_id in self._retired

    def _keep(self) -> None:
        """The nodes to `kept` (under the lock); a state dir that refuses it costs only the memory across a restart."""
        if self.kept is None:
            return
        doc = [{"node": node, "target": only, "until": until, "why": why}
               for (node, only), (until, why) in sorted(self._nodes.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]
        try:
            files.write_bytes(self.kept, json.dumps(doc).encode())
        except OSError as exc:
            log.warning("slurm.left_out_not_kept", path=str(self.kept), message=str(exc))


def read(kept: Path) -> dict[tuple[str, str | None], tuple[float, str]]:
    """What `kept` says ({} when it is missing or unreadable: a daemon that never left a node out, an older one)."""
    found: dict[tuple[str, str | None], tuple[float, str]] = {}
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        for entry in json.loads(kept.read_text()):
            only = entry["target"]
            found[(str(entry["node"]), None if only is None else str(only))] = (float(entry["until"]), str(entry["why"]))
    return found

"""The nodes this daemon leaves out of its cluster jobs for a while (executor slurm), and the cluster jobs whose agent
has spoken its last word: kept in memory (a restart forgets them), shared by the pool's workers and the ops thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

log = structlog.get_logger()

AVOID_S = 600.0  # how long a node that cannot serve (unfit.py) is left out: for an operator to load the image or mend
# the engine
RETIRED_KEEP_S = 3600.0  # a cluster job whose agent failed is no attempt's any more; forgotten after this (squeue's
# MinJobAge keeps an ended job 300 s by default)


class LeftOut:
    """Nodes left out (per target, or for every target) until a time, and retired cluster jobs."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str | None], tuple[float, str]] = {}  # (node, target or None) -> (until, why)
        self._retired: dict[int, float] = {}  # cluster id -> since

    def avoid(self, node: str, why: str, target: str | None = None) -> None:
        """Leave a node out for AVOID_S: for one target (its image missing, or its cluster job failed before ready)
        or all (None: its engine does not answer)."""
        with self._lock:
            self._nodes[(node, target)] = (self.clock() + AVOID_S, why)

    def listed(self) -> list[tuple[str, str | None, str]]:
        """(node, target or None, why) of every node left out now; the journal says when one is taken back."""
        now = self.clock()
        with self._lock:
            back = [key for key, (until, _) in self._nodes.items() if until <= now]
            for key in back:
                del self._nodes[key]
            left = [(node, only, why) for (node, only), (_, why) in self._nodes.items()]
        for node, only in back:
            log.info("slurm.node_taken_back", node=node, target=only, after_s=AVOID_S)
        return left

    def avoided(self, target: str | None = None) -> dict[str, str]:
        """The nodes left out now for `target` (None: for any), and why."""
        return {node: why for node, only, why in self.listed() if target is None or only in (None, target)}

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

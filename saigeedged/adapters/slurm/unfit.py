"""A Slurm node that cannot serve an attempt (executor slurm; docs/spec-executor-slurm.md, "A node that cannot
serve"): what its agent said instead of being ready, or its cluster job failing before that, and the node left out of
this daemon's next cluster jobs for a while (leftout.py) so that Slurm does not place job after job on it: a node
that fails its jobs in seconds is the first one free again."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, NoReturn

from saigeedged.adapters.events import event
from saigeedged.adapters.slurm.agent import forget, node_of
from saigeedged.adapters.slurm.cluster import Slurm, images
from saigeedged.adapters.slurm.leftout import AVOID_S
from saigeedged.config import Config
from saigeedged.errors import SaigeError
from saigeedged.executor import ClusterJob, capacity
from saigeedged.jobs import Job

NODE_FAULTS = ("IMAGE_NOT_FOUND", "DOCKER_UNAVAILABLE")  # an agent's errors that are its node's, not the job's
WHY_CHARS = 160  # of why a node is left out, kept for the dashboard


class Unfit:
    """The node faults of one target's attempts."""

    def __init__(self, config: Config, slurm: Slurm, target: str) -> None:
        self.config, self.slurm, self.target = config, slurm, target

    def refused(self, job: Job, doc: dict[str, Any], work: Path) -> NoReturn:
        """The agent's error instead of ready (of the attempt whose folder is `work`), raised naming its node
        (node_of). Its word is taken once: the ready file and the agent's log are removed and its cluster job retired
        (it may still look alive as it ends: the retake of the attempt must not wait on it). A node fault
        (NODE_FAULTS) leaves the node out: for this target when the image is missing, for every target when the
        engine does not answer."""
        err = doc["error"]
        said = SaigeError(err["code"], f"on node {node_of(doc) or '?'}: {err['message']}", hint=err.get("hint"))
        forget(work)
        cluster_id = doc.get("cluster_id")
        if isinstance(cluster_id, int):
            self.slurm.left_out.retire(cluster_id)
            with contextlib.suppress(SaigeError):  # ending already; Slurm not answering changes nothing
                self.slurm.cancel(cluster_id)
        if said.code in NODE_FAULTS:
            # Slurm's name of it (sbatch --exclude knows no other): the agent's, else the cluster job's batch host
            name = str(doc.get("slurm_node") or "") or self._ran_on(job) or node_of(doc)
            self.leave_out(job, name, self.target if said.code == "IMAGE_NOT_FOUND" else None, said, spend=False)
        raise said

    def drop_stale(self, ready: Path) -> bool:
        """Remove the ready file if it is the error of a retired cluster job (the share showed it late): never read
        twice. True when it was."""
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(ready.read_text())
            if isinstance(doc, dict) and "error" in doc and isinstance(doc.get("cluster_id"), int) \
                    and self.slurm.left_out.retired(doc["cluster_id"]):
                ready.unlink(missing_ok=True)
                return True
        return False

    def failed(self, job: Job, seen: ClusterJob | None, lost: SaigeError) -> NoReturn:
        """The attempt's cluster job ended before its agent was ready (`lost`, spent). One that FAILED on its node (the
        script or the agent exited non-zero: a node without the share, the interpreter, the package) leaves that node
        out for this target, unless it is the last one that serves it: the cause may be everywhere's (a full share, a
        package the nodes lack), and the partition is never emptied on a guess."""
        if seen is not None and seen.state == "FAILED" and seen.node:
            self.leave_out(job, seen.node, self.target, lost, spend=True)
        raise lost

    def leave_out(self, job: Job, name: str, only: str | None, said: SaigeError, spend: bool) -> NoReturn:
        """Leave node `name` out (for target `only`, or all) when it is a name Slurm knows (not a hostname); with
        `spend` only while another node serves the target. Then, unless `spend`, while another node serves it the job
        goes back to the queue without spending an attempt (no step ran; the next sbatch excludes the node):
        DOCKER_UNAVAILABLE. Else `said` stands, as on the local engine."""
        try:
            known = name in {n.name for n in self.slurm.nodes(fresh=True)}
            others = capacity([n for n in self.slurm.usable(self.target) if n.name != name], self.target,
                              images(self.config)[self.target])
        except SaigeError:  # Slurm does not answer now: the agent's word stands
            raise said from None
        if not known or (spend and not others):
            raise said
        self.slurm.left_out.avoid(name, said.message[:WHY_CHARS], only)
        event("job.node_left_out", job, "warning", node=name, target=only, error_code=said.code, message=said.message,
              hint=said.hint, for_s=AVOID_S, other_nodes=others)
        if spend or not others:
            raise said
        raise SaigeError("DOCKER_UNAVAILABLE", f"{said.message}; back to the queue for another node ({name} is left "
                         f"out of this daemon's {only or 'every'} target's jobs for {AVOID_S / 60:.0f} min)",
                         hint=said.hint)

    def _ran_on(self, job: Job) -> str:
        """Slurm's name of the node whose cluster job ran this attempt ("": not known)."""
        try:
            ran = [j.node for j in self.slurm.poll(job.job_id, fresh=True) if j.attempt == job.attempt and j.node]
        except SaigeError:
            return ""
        return ran[-1] if ran else ""

"""The only module that runs Slurm's commands (sbatch, squeue, scancel, scontrol, sinfo): the `Executor` of a Slurm
partition. `squeue --json` and `sinfo --json` are the truth for where an attempt runs and which nodes are up; their
answers are shared for `poll_interval_s`, so many followers cost one squeue."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from saigeedged.adapters.slurm.leftout import LeftOut
from saigeedged.config import Config
from saigeedged.errors import SaigeError
from saigeedged.executor import ClusterJob, ClusterNode, ExecutorSpec, feature, minutes
from saigeedged.guards import printable

log = structlog.get_logger()

CALL_TIMEOUT_S = 30.0  # one Slurm command; slurmctld restarting answers within its own MessageTimeout (10 s)
HINT = "is slurmctld up and munge running on this host? `sinfo` and `systemctl status slurmctld munge` say"
Run = Callable[[Sequence[str], str | None], str]
# sbatch's rejections that the next sbatch gets too (a partition's MaxTime under limits.job_timeout_s: "Requested time
# limit is invalid", an account or QOS the service's user lacks: "Invalid account...", "Access/permission denied"):
# read as "Slurm does not answer", the job was taken and requeued at once for ever. Those that pass stay
# DOCKER_UNAVAILABLE (wait, no attempt spent): "Socket timed out", a drained partition ("Required partition not
# available (inactive or drain)"), a submit limit of the QOS ("Job violates accounting/QOS policy")
REFUSED = re.compile(r"Batch job submission failed: (.*(?:Invalid|invalid|permission denied).*)")
REFUSED_HINT = ("check executor.partition (`sinfo`), limits.job_timeout_s against the partition's MaxTime (`scontrol "
                "show partition`) and the service user's account and QOS (`sacctmgr show assoc user=saigeedged`), then "
                "`saigeedged retry JOB_ID`")


def images(config: Config) -> dict[str, str]:
    """Each container target's image: a node serves a target when it has the GRES and this image's feature."""
    return {"cubie": config.cubie.image, "mobilint": config.mobilint.image}


def run_command(argv: Sequence[str], stdin: str | None = None) -> str:
    """Run one Slurm command; its stdout, or DOCKER_UNAVAILABLE (wait, no attempt spent) naming it and why."""
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SaigeError("DOCKER_UNAVAILABLE", f"cannot reach Slurm: `{argv[0]}`: {exc}", hint=HINT) from None
    if done.returncode != 0:
        refused = REFUSED.search(done.stderr)
        if refused:  # slurmctld answered, and will answer the same to the next sbatch: the job fails, no loop
            raise SaigeError("CONTAINER_FAILED", f"Slurm refused the cluster job: {printable(refused.group(1))[:300]}",
                             hint=REFUSED_HINT)
        raise SaigeError("DOCKER_UNAVAILABLE", f"cannot reach Slurm: `{' '.join(argv[:2])}` exited {done.returncode}: "
                         f"{done.stderr.strip()[-300:]}", hint=HINT)
    return done.stdout


class Slurm:
    """A Slurm partition as the daemon's executor (`executor: slurm`)."""

    def __init__(self, spec: ExecutorSpec, run: Run = run_command, clock: Callable[[], float] = time.monotonic,
                 left_out: LeftOut | None = None) -> None:
        self.spec, self.run, self.clock = spec, run, clock
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Any]] = {}
        self._generation = 0  # bumped by every change we make: an answer asked for before it is not kept
        self._silent_since: float | None = None  # squeue/sinfo have not answered since (said once in the journal)
        # nodes left out of the next cluster jobs, retired ones (unfit.py decides); the daemon's kept in state_dir
        self.left_out = left_out or LeftOut()

    def _json(self, argv: Sequence[str], fresh: bool) -> Any:
        """One command's --json answer, shared by every caller for poll_interval_s unless `fresh`."""
        key = " ".join(argv)
        with self._lock:
            seen = self._cache.get(key)
            if not fresh and seen is not None and self.clock() - seen[0] < self.spec.poll_interval_s:
                return seen[1]
            generation = self._generation
        try:
            doc = _answer(argv[0], self.run([*argv, "--json"], None))
        except SaigeError as exc:
            self._heard(exc)
            raise
        self._heard(None)
        with self._lock:
            if generation == self._generation:  # else a job was submitted or cancelled meanwhile: not the truth
                self._cache[key] = (self.clock(), doc)
        return doc

    def _heard(self, failure: SaigeError | None) -> None:
        """Slurm's reads failed (`failure`) or answered: the journal says when it stops and starts answering, once."""
        with self._lock:
            since, now = self._silent_since, self.clock()
            self._silent_since = (since or now) if failure is not None else None
        if failure is not None and since is None:
            log.warning("slurm.unavailable", error_code=failure.code, message=failure.message, hint=failure.hint)
        elif failure is None and since is not None:
            log.info("slurm.available", down_s=round(now - since, 1))

    def submit(self, name: str, target: str, image: str, base: int, script: str, limit_s: int) -> int:
        """sbatch; --time bounds the cluster job (its TERM kills the step) even when no daemon is left to end it."""
        out = self.run(["sbatch", "--parsable", f"--job-name={name}", f"--partition={self.spec.partition}",
                        f"--gres={target}:1", f"--constraint={feature(image)}", "--requeue", "--nodes=1",
                        "--ntasks=1", f"--comment=attempt={base}", f"--time={minutes(limit_s)}",
                        # the agent reports through the share; the daemon's own cwd (/ under systemd) is no place
                        # for slurm-<id>.out files, nor need it exist on the node
                        "--chdir=/", "--output=/dev/null", *self._exclude(target)], script)
        self._forget()  # the next poll sees the new job
        return int(out.strip().split(";")[0])

    def usable(self, target: str) -> list[ClusterNode]:
        """The partition's nodes but those left out for `target` (left_out)."""
        left_out = self.left_out.avoided(target)
        return [n for n in self.nodes() if n.name not in left_out]

    def _exclude(self, target: str) -> list[str]:
        """sbatch's --exclude of the nodes left out for `target` that the partition has now (asked afresh): sbatch
        refuses the whole job for a name it does not know ("Invalid node name specified": a dynamic node that left),
        and that refusal fails the job."""
        left_out = self.left_out.avoided(target)
        if not left_out:
            return []
        try:
            names = sorted(n.name for n in self.nodes(fresh=True) if n.name in left_out)
        except SaigeError:  # Slurm does not answer: the sbatch will say so
            return []
        return [f"--exclude={','.join(names)}"] if names else []

    def poll(self, name: str, fresh: bool = False) -> list[ClusterJob]:
        jobs = [_job(j) for j in self._json(["squeue", "--all"], fresh).get("jobs", [])]
        return sorted((j for j in jobs if j.name == name), key=lambda j: j.cluster_id)

    def cancel(self, cluster_id: int) -> None:
        self.run(["scancel", str(cluster_id)], None)
        self._forget()

    def cancel_live(self, name: str, upto: int | None = None) -> None:
        """Cancel every cluster job of saigeedged job `name` still alive (asked afresh), or only those serving an
        attempt up to `upto` (a later attempt's may be submitted meanwhile): each agent's TERM kills its step."""
        for live in (j for j in self.poll(name, fresh=True) if j.alive and (upto is None or j.attempt <= upto)):
            self.cancel(live.cluster_id)

    def _forget(self) -> None:
        with self._lock:
            self._generation += 1
            self._cache.clear()

    def start_now(self, cluster_id: int) -> None:
        """A job requeued off a lost node is held about 2 min (BeginTime): it may start again at once."""
        self.run(["scontrol", "update", f"JobId={cluster_id}", "StartTime=now"], None)
        self._forget()  # a change of ours, like submit and cancel: the shared answer still says BeginTime

    def release(self, cluster_id: int) -> None:
        """A job Slurm holds after a failed launch (its node is drained): it may run on another node."""
        self.run(["scontrol", "release", str(cluster_id)], None)
        self._forget()

    def nodes(self, fresh: bool = False) -> list[ClusterNode]:
        """The partition's nodes. sinfo --json ignores --partition (22.05: "all other filtering arguments will be
        ignored"): a node is the partition's by its own `partitions` list, or the free room, `check` and `status`
        counted every node of the cluster."""
        doc = self._json(["sinfo", f"--partition={self.spec.partition}"], fresh)
        if "nodes" not in doc and "sinfo" in doc:  # 23.02 on: entries grouped by state (scontrol has the nodes)
            release = str((doc.get("meta") or {}).get("Slurm", {}).get("release", "23.02 or later"))
            raise SaigeError("DOCKER_UNAVAILABLE", f"Slurm {printable(release)}'s `sinfo --json` groups its nodes, "
                             "which this release of saigeedged does not read: no node is counted, no job is taken",
                             hint="executor slurm reads the sinfo --json of Slurm 22.05 (Debian 12's); see "
                             "docs/spec-executor-slurm.md")
        seen: dict[str, ClusterNode] = {}
        for n in doc.get("nodes", []):
            if self.spec.partition in (n.get("partitions") or [self.spec.partition]):
                seen.setdefault(str(n.get("name")), _node(n))
        return list(seen.values())


def _answer(command: str, out: str) -> dict[str, Any]:
    """A --json answer, or DOCKER_UNAVAILABLE: squeue and sinfo exit 0 when slurmctld does not answer (after their own
    MessageTimeout of retries), with an empty list and the failure under `errors`; read as the truth, every running
    attempt looked gone (ENGINE_LOST) during a controller outage longer than that."""
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise SaigeError("DOCKER_UNAVAILABLE", f"cannot reach Slurm: `{command} --json` answered no JSON object: "
                         f"{printable(out[:200])}", hint=HINT)
    failed = doc.get("errors") or []
    if failed:
        said = "; ".join(printable(" ".join(str(e[k]) for k in ("source", "description", "error") if e.get(k))
                                   if isinstance(e, dict) else str(e)) for e in failed[:3])
        raise SaigeError("DOCKER_UNAVAILABLE", f"cannot reach Slurm: `{command} --json`: {said[:300]}", hint=HINT)
    return doc


def _listed(value: Any, sep: str | None = None) -> list[str]:
    """A field 22.05 gives as a string (`sep`-separated) and 23.11 on as a list of strings (job and node states,
    features): its words either way (read as one string, 23.11's `["RUNNING"]` was no live state: every attempt
    looked gone)."""
    if isinstance(value, list):
        return [str(v) for v in value]
    text = "" if value is None else str(value)
    return [w for w in (text.split(sep) if sep else [text]) if w]


def _job(doc: dict[str, Any]) -> ClusterJob:
    comment = str(doc.get("comment") or "")
    base = int(comment.removeprefix("attempt=")) if comment.startswith("attempt=") and comment[8:].isdigit() else 0
    words = _listed(doc.get("job_state"))  # 23.11: the base state, then its flags (22.05 names COMPLETING first)
    state = "COMPLETING" if "COMPLETING" in words else words[0] if words else ""
    return ClusterJob(int(doc.get("job_id", 0)), str(doc.get("name", "")), state,
                      int(doc.get("restart_cnt") or 0), base, str(doc.get("batch_host") or doc.get("nodes") or ""),
                      str(doc.get("state_reason") or ""), str(doc.get("state_description") or ""))


def _node(doc: dict[str, Any]) -> ClusterNode:
    state = " ".join([*_listed(doc.get("state")), *_listed(doc.get("state_flags"))]).lower()
    gres: dict[str, int] = {}
    for item in str(doc.get("gres") or "").split(","):
        name, _, count = item.partition(":")
        if name and count.split("(")[0].isdigit():
            gres[name] = int(count.split("(")[0])
    features = tuple(_listed(doc.get("active_features") or doc.get("features"), ","))
    return ClusterNode(str(doc.get("name")), state, gres, features, str(doc.get("reason") or ""))

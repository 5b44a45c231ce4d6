"""A target's container on a Slurm node, as a worker of the daemon sees it (executor slurm): the same interface as the
local engine's Container, reached through the attempt's cluster job and its agent (agent.py) by files on the share.

`ensure` finds or submits the cluster job of the job's current attempt (`squeue --json`: the one whose submitted
attempt plus its requeues is the store's attempt; any other live one is cancelled) and waits for its agent; a step
is asked for by `.steps/<n>.req` and followed as on the local engine, by its `.steps/<n>.{log,rc}`; Slurm says
whether the attempt still runs (requeued off a lost node: ENGINE_LOST, retryable; the requeued job serves the
next attempt). A cancel is `scancel` (the agent's TERM kills the step); a daemon stop leaves everything running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from saigeedged import files as filesmod
from saigeedged import jobid
from saigeedged.adapters.docker import Container, Containers, DockerAPI, Spec
from saigeedged.adapters.docker.detached import Files, Follower, Sink, Stopping
from saigeedged.adapters.docker.execs import STOPFILE
from saigeedged.adapters.events import event
from saigeedged.adapters.slurm.agent import DONE, LOG_SUFFIX, NODE_DIR, agent_log, forget, node_of, ready_of, ready_path
from saigeedged.adapters.slurm.cluster import Slurm
from saigeedged.adapters.slurm.unfit import Unfit
from saigeedged.config import Config
from saigeedged.errors import SaigeError
from saigeedged.executor import ClusterJob
from saigeedged.guards import printable
from saigeedged.jobs import FAILED, Job, remaining_s

WAIT_S = (0.02, 0.2)  # between looks for an agent's answer on the share: from the first to the longest, doubling
Current = Callable[[], tuple[Job | None, Path | None]]


# a ready file written as its cluster job ended may show this late on the share (NFS, actimeo=1) to the daemon's look
READY_GRACE_S = 2.0


def batch_script(job_dir: Path, base: int, spec: Spec, target: str, python: str = sys.executable) -> str:
    """The sbatch script of an attempt: node-step in the foreground (exec: it gets Slurm's TERM itself), its output in
    the attempt's agent log until it is ready (agent.agent_log)."""
    fields = json.dumps({"name": spec.name, "image": spec.image, "work_root": str(spec.work_root),
                         "runtime": spec.runtime, "user": spec.user, "owner": spec.owner})
    argv = [python, "-m", "saigeedged", "node-step", "--job-dir", str(job_dir), "--target", target, "--spec", fields]
    log = f'{shlex.quote(str(job_dir))}/"attempt$attempt{LOG_SUFFIX}"'
    return ("#!/bin/sh\n# a saigeedged attempt: its folder is named by the attempt submitted plus Slurm's requeues\n"
            f'attempt="$(({base} + ${{SLURM_RESTART_COUNT:-0}}))"\n'
            f'exec {shlex.join(argv)} --attempt "$attempt" >>{log} 2>&1\n')


def _last_words(log: Path) -> str:
    """What an agent that died before it was ready said last (a traceback's exception), or why nothing is known."""
    try:
        with filesmod.open_output(log) as f:  # on the share the container's steps write in: a regular file only
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError as exc:  # NotOutput too
        return (f"no agent log ({exc.strerror or exc}; looked for {log}): the node may not reach the share, or its "
                "script never ran")
    return f"its agent said: {printable(lines[-1].strip())[:300]}" if lines else f"its agent wrote nothing ({log})"


def _appears(ready: Path, grace_s: float) -> bool:
    """Does the ready file show within `grace_s`? Each look reads its folder first: an NFS client may answer a
    lookup from its cache of the folder, which a read of the folder renews."""
    deadline = time.monotonic() + grace_s
    while True:
        with contextlib.suppress(OSError):
            os.listdir(ready.parent)
        if ready.exists():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(WAIT_S[1])


class NodeContainer(Container):
    """The target's container on the node that runs the current attempt's cluster job."""

    def __init__(self, config: Config, slurm: Slurm, target: str, current: Current,
                 interrupted: Callable[[], str | None], python: str = sys.executable,
                 ready_grace_s: float = READY_GRACE_S) -> None:
        super().__init__(cast(DockerAPI, None), Spec.for_target(config, target), lambda event, fields: None)
        self.config, self.slurm, self.target = config, slurm, target
        self.current, self.interrupted = current, interrupted
        self.node = ""
        self.cluster_id: int | None = None
        self.serving: tuple[str, int] | None = None  # the attempt whose agent is ready
        self.unfit = Unfit(config, slurm, target)
        self.python, self.ready_grace_s = python, ready_grace_s  # the nodes' interpreter; see READY_GRACE_S

    def beside(self) -> Container | None:
        """None: a step runs on the node of its attempt's cluster job, which its worker holds (Slurm's GRES)."""
        return None

    def _attempt(self) -> tuple[Job, Path]:
        job, work = self.current()
        assert job is not None and work is not None, "a node container is used only by a worker's running job"
        return job, work

    def ensure(self) -> Any:
        """The attempt's cluster job, submitted if needed, running with its agent ready (waits while it is queued)."""
        job, work = self._attempt()
        if self.serving == (job.job_id, job.attempt):
            return None  # asked again within the attempt (its toolchain, then its steps)
        mine = self._cluster_job(job, work)
        ready = ready_path(work.parent, job.attempt)
        poll = WAIT_S[0]
        # a cluster job Slurm never places (every node serving it drained, say) ends with the attempt's time, as a
        # step would: the attempt's whole life counts
        started = job.attempts[-1]["started_at"] if job.attempts else ""
        deadline = time.monotonic() + remaining_s(started, jobid.utc_now(), self.config.limits.job_timeout_s)
        while not ready.exists():
            self._check_interrupted()
            seen = self._seen(job, mine.cluster_id, fresh=False) or self._seen(job, mine.cluster_id, fresh=True)
            if seen is None or not seen.alive or seen.attempt != job.attempt:
                if _appears(ready, self.ready_grace_s):  # its agent said something as it ended: read below
                    break
                self.unfit.failed(job, seen, SaigeError("ENGINE_LOST", _lost(mine.cluster_id, seen, job.attempt,
                                                                             work.parent), step=job.step))
            if time.monotonic() > deadline:
                raise SaigeError("TIMEOUT", f"cluster job {mine.cluster_id} waited for a node longer than "
                                 f"limits.job_timeout_s ({seen.describe()})",
                                 hint="`saigeedged check` lists the nodes that serve the target and why the others "
                                 "do not")
            if seen.launch_failed:  # Slurm drained the node that failed it: another node may run it
                event("job.launch_failed", job, "warning", cluster_id=seen.cluster_id, attempt=job.attempt,
                      reason=seen.detail)
                self.slurm.release(seen.cluster_id)
            elif seen.state == "PENDING" and seen.reason == "BeginTime" and self.slurm.spec.fast_requeue:
                self.slurm.start_now(seen.cluster_id)
            time.sleep(poll)
            poll = min(poll * 2, WAIT_S[1])
        doc = self._ready(job, work)
        self.node, self.image_id = node_of(doc), doc.get("image_id")
        self.cluster_id = mine.cluster_id
        self.serving = (job.job_id, job.attempt)
        event("job.placed", job, node=self.node, cluster_id=self.cluster_id, attempt=job.attempt)
        return None

    def _ready(self, job: Job, work: Path) -> dict[str, Any]:
        """The ready file of the attempt whose folder is `work`, or the error its agent says instead (it could not make
        the node's container) raised."""
        doc: dict[str, Any] = json.loads(ready_of(work).read_text())
        if "error" in doc:
            self.unfit.refused(job, doc, work)
        return doc

    def _seen(self, job: Job, cluster_id: int, fresh: bool) -> ClusterJob | None:
        """The cluster job as squeue says (a shared answer may predate it: then one asked now)."""
        return next((j for j in self.slurm.poll(job.job_id, fresh) if j.cluster_id == cluster_id), None)

    def _cluster_job(self, job: Job, work: Path) -> ClusterJob:
        """The live cluster job of this attempt: found (a daemon restart, a requeue) or submitted now."""
        # a retired cluster job (its agent's error read) may look alive as it ends: it is no attempt's
        live = [j for j in self.slurm.poll(job.job_id, fresh=True)
                if j.alive and not self.slurm.left_out.retired(j.cluster_id)]
        mine = next((j for j in live if j.attempt == job.attempt), None)
        ready = ready_path(work.parent, job.attempt)
        placed = mine is None and ready.exists() and not self.unfit.drop_stale(ready)
        if placed:
            self._ready(job, work)  # the agent's own error first (read after a restart)
        for other in live:
            # an attempt the store has moved past must not hold a node; a lost attempt's requeued job serves the next
            if other is not mine and not (placed and other.attempt > job.attempt):
                self.slurm.cancel(other.cluster_id)
        if mine is not None:
            return mine
        if placed:  # (a re-attach) a new cluster job for it would find its steps asked for and never run them
            seen = ", ".join(f"{j.cluster_id} {j.describe()} for attempt {j.attempt}" for j in live) or "no cluster job"
            raise SaigeError("ENGINE_LOST", f"no cluster job serves attempt {job.attempt} any more, which a node ran "
                             f"({seen}): "
                             "its node was lost, or Slurm requeued, preempted or ended it, while the daemon was away",
                             step=job.step)
        forget(work)  # a word of an earlier cluster job is not this one's
        script = batch_script(work.parent, job.attempt, self.spec, self.target, self.python)
        cluster_id = self.slurm.submit(job.job_id, self.target, self.spec.image, job.attempt, script,
                                       self.config.limits.job_timeout_s)
        return ClusterJob(cluster_id, job.job_id, "PENDING", 0, job.attempt)

    def _check_interrupted(self) -> None:
        reason = self.interrupted()
        if reason == "stop":  # the cluster job keeps its place in Slurm's queue: the next start waits for it again
            raise SaigeError("CANCELLED", "the daemon stops; the cluster job stays queued and is waited for at the "
                             "next start", reason="stop", detached=True)
        if reason is not None:
            raise SaigeError("CANCELLED", f"the job was interrupted while its cluster job waited ({reason})",
                             reason=reason)

    def _ask(self, work: Path, name: str, payload: bytes, answer: str) -> Path:
        """Write a request for the agent, wait for the file of its answer (bounded by limits.engine_timeout_s)."""
        (work / NODE_DIR).mkdir(parents=True, exist_ok=True)
        filesmod.write_bytes(work / NODE_DIR / name, payload)
        deadline, poll = time.monotonic() + self.config.limits.engine_timeout_s, WAIT_S[0]
        while not (work / NODE_DIR / answer).exists():
            if time.monotonic() > deadline:
                raise SaigeError("DOCKER_UNAVAILABLE", f"the agent on node {self.node} did not answer within "
                                 f"{self.config.limits.engine_timeout_s:.0f}s")
            time.sleep(poll)
            poll = min(poll * 2, WAIT_S[1])
        return work / NODE_DIR / answer

    def probe(self, script: str) -> tuple[int, str]:
        _, work = self._attempt()
        key = f"probe-{uuid.uuid4().hex[:8]}"
        rc = self._ask(work, f"{key}.sh", script.encode(), f"{key}.rc")
        out = (work / NODE_DIR / f"{key}.out").read_text(errors="replace")
        code = int(rc.read_text().strip() or -1)
        for suffix in ("sh", "out", "rc"):
            (work / NODE_DIR / f"{key}.{suffix}").unlink(missing_ok=True)
        return code, out

    def run_step(self, argv: Sequence[str], workdir: Path, timeout_s: int, sink: Sink,
                 env: dict[str, str] | None = None, replay: Sink | None = None,
                 stopping: Stopping = lambda: False, number: int | None = None) -> int:
        """One step on the node, started by its agent and followed by its files on the share (SPEC §15).

        The attempt's record says the step was asked for (and where) before the request is written, as the local
        engine records an exec before it starts: a daemon stopped now leaves the step running and the next one
        re-attaches to it. The request is written again when it is missing (a daemon stopped between the two)."""
        files = Files(workdir, self._next_step(workdir) if number is None else number, self.book)
        if not files.started():
            self.raise_if_cancelled(argv)
            files.book.launched(workdir, files.n, f"slurm job {self.cluster_id} on {self.node}")
        if not files.path("req").exists():
            files.base.parent.mkdir(parents=True, exist_ok=True)
            filesmod.write_bytes(files.path("req"), json.dumps({"argv": list(argv), "timeout_s": timeout_s,
                                                                "env": env}).encode())
        code = _Follower(self._gone, files, sink, replay).follow(stopping)
        self.raise_if_cancelled(argv)
        if code >= 128:
            self._ended_by_slurm(code)
        return code

    def _ended_by_slurm(self, code: int) -> None:
        """A step that ended by a signal: the agent kills its attempt's step when Slurm ends or requeues the cluster job
        (preemption, `scontrol requeue`, an operator's scancel, the time limit). Then the attempt is lost (ENGINE_LOST,
        retried), not the step's failure. Slurm not answering: the step's own code stands."""
        job, _ = self._attempt()
        try:
            jobs = self.slurm.poll(job.job_id, fresh=True)
        except SaigeError:
            return
        if any(j.attempt == job.attempt and j.state == "RUNNING" for j in jobs):
            return
        seen = ", ".join(f"{j.cluster_id} {j.describe()}" for j in jobs) or "no cluster job"
        raise SaigeError("ENGINE_LOST", f"a step of attempt {job.attempt} on node {self.node or '?'} ended by a signal "
                         f"(exit {code}) as Slurm ended its cluster job ({seen}): requeued, preempted, cancelled or "
                         "out of time", step=job.step)

    def _gone(self, follower: Follower) -> bool:
        """Does Slurm no longer run this attempt (requeued off a lost node, failed)? Unknown (Slurm not answering, a
        controller restart) is not gone: the step's own files decide meanwhile."""
        job, _ = self._attempt()

        def running(jobs: list[ClusterJob]) -> bool:
            return any(j.alive and j.attempt == job.attempt and j.state != "PENDING" for j in jobs)

        try:
            jobs = self.slurm.poll(job.job_id)
            if not running(jobs):  # a shared answer may predate the agent's start (PENDING): asked now before it counts
                jobs = self.slurm.poll(job.job_id, fresh=True)
        except SaigeError:
            return False
        if running(jobs):
            return False
        if follower._look() is not None:
            return False  # it ended just now: the next look returns its code
        reason = self.interrupted()  # once: the worker's answer may ask the store
        if reason is not None:
            raise SaigeError("CANCELLED", f"the job was cancelled ({reason})", reason=reason)
        seen = ", ".join(f"{j.cluster_id} {j.state} restarts {j.restarts}" for j in jobs) or "no cluster job"
        raise SaigeError("ENGINE_LOST", f"node {self.node or '?'} no longer runs attempt {job.attempt} ({seen}): "
                         "Slurm requeued it off a lost node, or it ended", step=job.step)

    def interrupt(self, workdir: Path, reason: str, later: bool = False) -> None:
        """A cancel ends the attempt's cluster job: its agent's TERM kills the step on the node."""
        try:
            filesmod.write_in(workdir, STOPFILE, reason.encode())
        except OSError:
            pass
        job = self.current()[0]
        if reason == "stop" or job is None:
            return
        try:
            self.slurm.cancel_live(job.job_id)
        except SaigeError:
            pass  # Slurm does not answer now: the agent still sees the stop file's step end with the attempt's done

    def end_job(self, ended: Path | None) -> None:
        """The attempt is over (not left running by a stop): its agent ends and frees the node's GRES."""
        self._steps.clear()
        self.serving = None
        if ended is None:
            return
        job, _ = self.current()
        if ended.is_dir():
            (ended / DONE).parent.mkdir(exist_ok=True)
            filesmod.write_bytes(ended / DONE, b"")
        forget(ended)  # the ended attempt's (a requeue has moved `job.attempt` on); the log of an agent that died
        # before it was ready (a ready one removed its own)
        if job is not None and job.state == FAILED:  # no attempt follows: a requeued or held cluster job goes too
            try:
                self.slurm.cancel_live(job.job_id)
            except SaigeError:
                pass  # Slurm does not answer now: squeue still lists it under the job's id

    def recreate(self) -> None:
        """Nothing: the node's own container is made afresh by the next attempt's agent when it died."""

    def follow_image(self) -> None:
        """Nothing: the node's agent reports the image ID its container runs (the cache key names it)."""

    def reap(self, workdirs: Sequence[Path]) -> None:
        """Nothing: Slurm cancels a stale job when its node returns, and its agent kills the step."""


def _lost(cluster_id: int, seen: ClusterJob | None, attempt: int, job_dir: Path) -> str:
    """Why the cluster job of `attempt` no longer serves it, before its node was ready."""
    if seen is None or not seen.alive:
        where = f" on node {seen.node}" if seen is not None and seen.node else ""
        return (f"cluster job {cluster_id} ended{where} before its node was ready "
                f"({seen.describe() if seen else 'gone'}); {_last_words(agent_log(job_dir, attempt))}")
    return (f"Slurm requeued cluster job {cluster_id} before its node was ready: it now runs attempt {seen.attempt}, "
            f"not {attempt} ({seen.describe()})")


class _Follower(Follower):
    """The local engine's follower of a step's files; whether the step still runs is Slurm's to say."""

    def __init__(self, gone: Callable[[Follower], bool], files: Files, sink: Sink, replay: Sink | None) -> None:
        super().__init__(None, files, sink, replay)
        self.gone = gone

    def _gone(self) -> bool:
        return self.gone(self)


class SlurmContainers(Containers):
    """A worker's containers when steps run on a Slurm partition: one NodeContainer per target, no host lock (Slurm's
    GRES keep one job per target per node); `release` is the local engine's (no lock is ever held)."""

    def __init__(self, config: Config, slurm: Slurm) -> None:
        super().__init__(config)
        self.slurm = slurm
        self.current: Current = lambda: (None, None)  # the worker's running job and work dir (set by the pool)
        self._nodes: dict[str, NodeContainer] = {}

    def container(self, target: str) -> Container:
        if target not in self._nodes:
            self._nodes[target] = NodeContainer(self.config, self.slurm, target, lambda: self.current(),
                                                lambda: self.interrupted())
        return self._nodes[target]

    def get(self, target: str) -> Container:
        self.active = self.container(target)
        self.active.book = self.book  # the worker's: its steps are recorded in the attempt's record, as on the engine
        self.active.ensure()
        return self.active

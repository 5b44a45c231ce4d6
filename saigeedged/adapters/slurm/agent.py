"""`saigeedged node-step`: the agent an attempt's Slurm job runs on its compile host (the node side of executor slurm).

It makes the target's long-lived container ready on the node's own Docker engine (the local engine's code: created,
started, the work share bind-mounted at its own path), says so in `<job>/attempt<N>.node`, then starts each step the
daemon asks for (`.steps/<n>.req`) with the local engine's detached wrapper, which writes `.steps/<n>.log`, the pids
and `.steps/<n>.rc` on the share, and answers the daemon's probes (`.node/probe-<k>.sh`). N is the attempt the job was
submitted for plus SLURM_RESTART_COUNT: a stale copy (a partitioned node) writes only to its own attempt's folder.

It ends when the daemon is done with the attempt (`.node/done`, or the folder removed) or on SIGTERM (scancel, a
requeue, a stale job cancelled when its node returns, the time limit): then the step still running is killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from saigeedged import files as filesmod
from saigeedged.adapters import signals
from saigeedged.adapters.docker import Container, Spec, connect
from saigeedged.adapters.docker.detached import Files
from saigeedged.adapters.docker.execs import folders
from saigeedged.engines import DEFAULT
from saigeedged.errors import SaigeError

POLL_S = 0.05  # between looks at the attempt's folder for requests (a directory listing on the share)
# the attempt's folder missing this long after it was seen: the daemon removed it (the attempt ended, and the done
# marker went with the folder). Longer than a re-creation of the folder (rmtree + mkdir), short because the cluster
# job holds its node's GRES until the agent exits: 5 s here cost every job 5 s (bench/slurm.py)
GONE_GRACE_S = 0.5
NODE_DIR, DONE = ".node", ".node/done"
LOG_SUFFIX = ".agent.log"


def ready_path(job_dir: Path, attempt: int) -> Path:
    """Where the agent of an attempt says it is ready: beside the attempt's folder (which the daemon may recreate)."""
    return ready_of(job_dir / f"attempt{attempt}")


def ready_of(work: Path) -> Path:
    """ready_path of the attempt whose folder is `work`."""
    return work.with_name(f"{work.name}.node")


def agent_log(job_dir: Path, attempt: int) -> Path:
    """Where the batch script of an attempt sends its agent's output until the agent is ready (beside the attempt's
    folder, like its ready file): Slurm's own output goes nowhere (sbatch --output=/dev/null), and an agent that died
    before it was ready left the daemon nothing to tell but that its cluster job had ended."""
    return log_of(job_dir / f"attempt{attempt}")


def log_of(work: Path) -> Path:
    """agent_log of the attempt whose folder is `work`."""
    return work.with_name(f"{work.name}{LOG_SUFFIX}")


def forget(work: Path) -> None:
    """The word on the share of the attempt whose folder is `work` removed (its ready file, its agent's log): read
    already, or an earlier cluster job's."""
    ready_of(work).unlink(missing_ok=True)
    log_of(work).unlink(missing_ok=True)


def _names() -> dict[str, str]:
    """This node's names in a ready file: its hostname, and Slurm's name of it (which sbatch --exclude knows)."""
    return {"node": socket.gethostname(), "slurm_node": os.environ.get("SLURMD_NODENAME", "")}


def node_of(doc: dict[str, Any]) -> str:
    """The node a ready file names: Slurm's name of it, else (an agent that does not say it) its hostname."""
    return str(doc.get("slurm_node") or doc.get("node") or "")


def _quiet(log: Path) -> None:
    """Ready: the agent's output goes nowhere from now on, as Slurm's, and its log is removed (closed first: on NFS a
    file removed while open is renamed .nfsXXXX until closed, and the job's folder could not be removed at its end)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(null, fd)
    finally:
        os.close(null)
    log.unlink(missing_ok=True)


class Agent:
    """Serves one attempt's requests on this node until the daemon is done with it or a TERM comes."""

    def __init__(self, container: Container, job_dir: Path, attempt: int, stop: threading.Event) -> None:
        self.container, self.stop = container, stop
        self.job_dir, self.attempt = job_dir, attempt
        self.work = job_dir / f"attempt{attempt}"
        self.launched: set[tuple[str, int]] = set()  # (folder under the attempt's, "" for its own; step number)
        self.answered: set[str] = set()

    def announce(self, cluster_id: str, restarts: str) -> None:
        self.container.ensure()
        doc = {**_names(), "image_id": self.container.image_id, "cluster_id": cluster_id, "restarts": restarts,
               "pid": os.getpid()}
        filesmod.write_bytes(ready_path(self.job_dir, self.attempt), json.dumps(doc).encode())

    def serve(self) -> int:
        """Serve requests; the exit code of the batch job (0: the daemon ended the attempt, 143: a TERM)."""
        missing = 0.0
        seen = False
        while not self.stop.is_set():
            if self.work.is_dir():
                seen, missing = True, 0.0
                if (self.work / DONE).exists():
                    break
                self._steps()
                self._probes()
            elif seen:
                missing += POLL_S
                if missing >= GONE_GRACE_S:
                    break
            self.stop.wait(POLL_S)
        self._kill_running()
        return 143 if self.stop.is_set() else 0

    def _steps(self) -> None:
        for folder in folders(self.work):  # a sweep's steps are asked for in <attempt>/variantN/.steps/
            for req in sorted((folder / ".steps").glob("*.req")):
                n = int(req.name.split(".")[0])
                files, key = Files(folder, n), ("" if folder == self.work else folder.name, n)
                if key in self.launched or files.started():
                    continue
                self.launched.add(key)
                ask: dict[str, Any] = json.loads(req.read_text())
                self.container.launch(files, ask["argv"], int(ask["timeout_s"]), ask.get("env"))

    def _probes(self) -> None:
        for ask in sorted((self.work / NODE_DIR).glob("probe-*.sh")):
            if ask.name in self.answered:
                continue
            self.answered.add(ask.name)
            code, out = self.container.probe(ask.read_text())
            base = ask.with_suffix("")
            filesmod.write_bytes(base.with_suffix(".out"), out.encode())
            filesmod.write_bytes(base.with_suffix(".rc"), str(code).encode())

    def _kill_running(self) -> None:
        """A step of this attempt without an exit code yet is killed: nothing of it runs on after its job."""
        if any(not Files(self.work / folder, n).path("rc").exists() for folder, n in self.launched):
            self.container.interrupt(self.work, "cancel")  # the variants' folders too


def main(job_dir: Path, attempt: int, target_spec: dict[str, str], timeout_s: float) -> int:
    """The node-step command: `target_spec` is the container's Spec fields as the daemon's config has them."""
    stop = threading.Event()
    signals.Relay({signal.SIGTERM: stop.set, signal.SIGINT: stop.set})  # only a flag: the loop kills the step
    spec = Spec(target_spec["name"], target_spec["image"], Path(target_spec["work_root"]), target_spec["runtime"],
                target_spec["user"], target_spec["owner"])
    try:
        container = Container(connect(DEFAULT, timeout_s), spec, lambda event, fields: print(event, fields, flush=True))
        agent = Agent(container, job_dir, attempt, stop)
        agent.announce(os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_RESTART_COUNT", "0"))
    except SaigeError as exc:  # the daemon reads it beside the attempt's folder (unfit.py: the job fails, waits, or
        # goes back to the queue for another node)
        print(f"{exc.code}: {exc.message}", file=sys.stderr, flush=True)  # the log's last line, should this write fail
        cluster_id = os.environ.get("SLURM_JOB_ID", "")  # retired by the daemon once read: it may still look alive
        filesmod.write_bytes(ready_path(job_dir, attempt), json.dumps({
            "error": exc.as_dict(None), **_names(), "cluster_id": int(cluster_id) if cluster_id.isdigit() else None
        }).encode())
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    _quiet(agent_log(job_dir, attempt))
    return agent.serve()

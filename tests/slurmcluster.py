"""A real Slurm cluster for the tests of `executor: slurm`: node containers built from Debian packages (tests/slurmnode),
each with munge, slurmd and its own dockerd, on a user network of their own; the first node runs slurmctld too.

A host folder is bind-mounted at the same path in every node as the work share, and the worktree (with its .venv) at
its own path, so `saigeedged node-step` and the daemon run there as built here. The stand-in compiler images are
`docker save | docker load`ed into each node's engine, as a vendor tarball is loaded. Teardown leaves nothing:
the nodes (with their volumes), the network, the nodes' cgroup folders.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent
CGROUP = Path("/sys/fs/cgroup")
TIMEOUT_S = 10  # SlurmdTimeout: a node silent this long is down and its jobs are requeued (the spike's setting)
GRES = ("cubie", "mobilint")
PROLOG = HERE / "slurmnode" / "prolog"  # the worktree is mounted at its own path on every node
FAILING = "/run/saige-prolog-fails"  # on a node: its prolog fails, so it cannot launch a job


def image() -> str:
    """The node image's tag: built by tests/slurmnode/build on first use, reused while its inputs are unchanged."""
    run = subprocess.run([str(HERE / "slurmnode" / "build")], capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout.strip().splitlines()[-1]


def _caps() -> list[str]:
    from systemdbox.box import missing_caps

    return [f"--cap-drop={c}" for c in missing_caps()]


def _interpreter() -> list[str]:
    """The .venv's base interpreter, bind-mounted at its own path when it is not the system's (pyenv on CI)."""
    base = Path(sys.base_prefix)
    return [] if base == Path("/usr") else ["-v", f"{base}:{base}:ro"]


def slurm_conf(cluster: str, controller: str, nodes: Iterable[str], features: Iterable[str]) -> str:
    """The controller's slurm.conf: configless for the other nodes, fast failure detection, requeue on node loss."""
    feats = ",".join([*GRES, *features])
    return "\n".join([
        f"ClusterName={cluster}", f"SlurmctldHost={controller}", "AuthType=auth/munge", "SlurmUser=root",
        "SlurmdUser=root", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        f"SlurmdTimeout={TIMEOUT_S}", "ReturnToService=2", "JobRequeue=1", "MaxNodeCount=8",
        "SlurmctldParameters=enable_configless", f"GresTypes={','.join(GRES)}",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "MinJobAge=600",
        "StateSaveLocation=/var/spool/slurmctld", "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log", "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "SchedulerParameters=sched_interval=2", "InactiveLimit=0", "KillWait=15", f"Prolog={PROLOG}",
        f"NodeName={','.join(nodes)} CPUs=2 RealMemory=500 Gres={','.join(g + ':1' for g in GRES)} "
        f"Feature={feats} State=UNKNOWN",
        "PartitionName=saige Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO", ""])


class Node:
    """One node container: `sh` runs a bash script in it as root."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sh(self, script: str, check: bool = True, timeout: float = 60,
           stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        run = subprocess.run(["docker", "exec", "-i", self.name, "bash", "-c", script], capture_output=True,
                             text=stdin is None, input=stdin, timeout=timeout)
        out, err = (run.stdout, run.stderr) if stdin is None else (run.stdout.decode(), run.stderr.decode())
        assert not check or run.returncode == 0, f"{self.name}: {script}\n--- exit {run.returncode}\n{out[-3000:]}\n{err[-3000:]}"
        return subprocess.CompletedProcess(run.args, run.returncode, out, err)

    def docker(self, *argv: str, check: bool = True) -> str:
        """The node's own Docker engine."""
        return self.sh(" ".join(["docker", *argv]), check=check).stdout


class Cluster:
    """The running cluster: nodes by name, the share, the network; `features` are the nodes' image features."""

    def __init__(self, share: Path, features: Iterable[str], images: Iterable[str]) -> None:
        self.prefix = f"sgslurm-{uuid.uuid4().hex[:6]}"
        self.share, self.features, self.images = share, tuple(features), tuple(images)
        self.network = self.prefix
        self.image = image()
        self.nodes: dict[str, Node] = {}
        self.loaded: Path = share.parent / f"{self.prefix}-images.tar"

    def name(self, n: int) -> str:
        return f"{self.prefix}-n{n}"

    @property
    def controller(self) -> Node:
        return self.nodes[self.name(1)]

    def start(self, count: int = 3) -> None:
        subprocess.run(["docker", "network", "create", "--internal", self.network], check=True, capture_output=True,
                       timeout=60)
        subprocess.run(["docker", "save", "-o", str(self.loaded), *self.images], check=True, timeout=300)
        names = [self.name(n) for n in range(1, count + 1)]
        for name in names:
            self._run(name)
        ctl = self.controller
        gres = "".join(f"Name={g} Count=1\\n" for g in GRES)
        ctl.sh(f"cat > /etc/slurm/slurm.conf <<'EOF'\n{slurm_conf(self.prefix, ctl.name, names, self.features)}EOF\n"
               f"printf '{gres}' > /etc/slurm/gres.conf; slurmctld")
        for name in names:
            self._slurmd(self.nodes[name])
        self.wait_idle(names)

    def _run(self, name: str) -> Node:
        """Start a node container with its dockerd and munged, the stand-in images loaded."""
        self._create(name)
        node = self.nodes[name] = Node(name)
        self._services(node)
        with self.loaded.open("rb") as fh:
            node.sh("docker load -q", stdin=fh.read(), timeout=300)
        return node

    def _services(self, node: Node) -> None:
        node.sh("mkdir -p /var/log/slurm /run/munge && chown munge:munge /run/munge && runuser -u munge -- munged")
        self.revive_engine(node)

    def revive_engine(self, node: Node) -> None:
        """Start the node's own dockerd (again, when a test stopped it) and wait until it answers."""
        node.sh(f"pgrep -x dockerd >/dev/null || (dockerd --cgroup-parent /{node.name} --bridge=none --iptables=false "
                "--ip6tables=false > /var/log/dockerd.log 2>&1 &); "
                "for _ in $(seq 300); do docker info >/dev/null 2>&1 && break; sleep 0.1; done; docker info >/dev/null")

    def revive(self, node: Node) -> None:
        """A killed node powers on again: its daemons start, Slurm returns it to service (ReturnToService=2)."""
        subprocess.run(["docker", "start", node.name], check=True, capture_output=True, timeout=120)
        self._services(node)
        self._slurmd(node)
        self.wait_idle([node.name])

    def prefer(self, first: Node | None) -> None:
        """Slurm places jobs on `first` before any other node (the lowest Weight); None: every node alike again."""
        for node in self.nodes.values():
            self.controller.sh(f"scontrol update NodeName={node.name} Weight={1 if first in (None, node) else 10}")

    def drain(self, node: Node, on: bool) -> None:
        """Keep new jobs off a node (the daemon's host, in the tests that kill or cut a node), or let them in again."""
        state = "DRAIN Reason=test" if on else "RESUME"
        self.controller.sh(f"scontrol update NodeName={node.name} State={state}", check=on)  # RESUME: drained or not

    def reset(self) -> None:
        """After a test: no job left, and every node Slurm drained (a failed launch, a duplicate job on a node back
        from a partition) or the test did is in service again, so the next test finds the whole cluster."""
        self.controller.sh("scancel --user root", check=False)
        for name, state in self.states().items():
            self.nodes[name].sh(f"rm -f {FAILING}", check=False)
            if "drain" in state:
                self.drain(self.nodes[name], False)

    def _create(self, name: str) -> None:
        # --init: daemons started by `docker exec` are re-parented to PID 1, which must reap them (a restarted
        # slurmctld would otherwise stay a zombie that `kill -0` still finds)
        subprocess.run(["docker", "run", "-d", "--init", "--name", name, "--hostname", name, "--network", self.network,
                        "--label", f"saigeedged.test={self.prefix}", "--cap-add=ALL", *_caps(),
                        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
                        "--security-opt", "systempaths=unconfined", "--cgroupns=host",
                        "-v", f"{CGROUP}:{CGROUP}:rw", "--tmpfs", "/run", "-v", "/var/lib/docker",
                        "-v", f"{ROOT}:{ROOT}:ro", *_interpreter(), "-v", f"{self.share}:{self.share}", self.image],
                       check=True, capture_output=True, timeout=120)

    def _slurmd(self, node: Node, dynamic: bool = False) -> None:
        args = f"--conf-server {self.controller.name}" if node is not self.controller else ""
        if dynamic:
            gres = ",".join(g + ":1" for g in GRES)
            args += f" -Z --conf 'CPUs=2 RealMemory=500 Gres={gres} Feature={','.join([*GRES, *self.features])}'"
        node.sh(f"slurmd {args}")

    def join(self, n: int) -> Node:
        """A new node joins the running cluster (dynamic, no edit to slurm.conf) and is idle."""
        node = self._run(self.name(n))
        self._slurmd(node, dynamic=True)
        self.wait_idle([node.name])
        return node

    def stop_controller(self) -> None:
        """SIGTERM to slurmctld, returning once it is gone (its state is saved in StateSaveLocation)."""
        self.controller.sh("p=$(cat /run/slurmctld.pid); kill -TERM $p; "
                           "for _ in $(seq 300); do kill -0 $p 2>/dev/null || break; sleep 0.1; done")

    def start_controller(self) -> None:
        self.controller.sh("slurmctld")

    def restart_controller(self) -> None:
        self.stop_controller()
        self.start_controller()

    def json(self, *argv: str) -> Any:
        return json.loads(self.controller.sh(" ".join([*argv, "--json"])).stdout)

    def states(self) -> dict[str, str]:
        """Node name -> its state as sinfo says (idle, mixed, allocated, down...)."""
        out = self.controller.sh("sinfo -h -N -o '%N %T'").stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def wait_idle(self, names: Iterable[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        names = list(names)
        while True:
            states = self.states()
            if all(states.get(n, "").rstrip("*") in ("idle", "mixed", "allocated") for n in names):
                return
            assert time.monotonic() < deadline, f"nodes not up: {states}"
            time.sleep(0.2)

    def kill(self, node: Node) -> None:
        """Power loss: the node's container dies with everything in it."""
        subprocess.run(["docker", "kill", node.name], check=True, capture_output=True, timeout=60)

    def describe(self) -> str:
        """The cluster's jobs and nodes and the controller's last log lines (for a failing test's message)."""
        return self.controller.sh("squeue --all -o '%i %j %T %r %N %k'; sinfo -N -o '%N %T %E'; "
                                  "tail -n 40 /var/log/slurm/slurmctld.log", check=False, timeout=30).stdout

    def cut(self, node: Node) -> None:
        subprocess.run(["docker", "network", "disconnect", self.network, node.name], check=True, capture_output=True,
                       timeout=60)

    def heal(self, node: Node) -> None:
        """Reconnect a cut node (nothing to do when it is connected)."""
        subprocess.run(["docker", "network", "connect", self.network, node.name], capture_output=True, timeout=60)

    def teardown(self) -> None:
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=saigeedged.test={self.prefix}"],
                             capture_output=True, text=True, timeout=60).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", "-v", *ids], capture_output=True, timeout=300)
        subprocess.run(["docker", "network", "rm", self.network], capture_output=True, timeout=60)
        with contextlib.suppress(FileNotFoundError):
            self.loaded.unlink()
        for folder in CGROUP.glob(f"*/{self.prefix}-n*"):
            _rmdirs(folder)

    def leftovers(self) -> list[str]:
        """What teardown should have removed: containers, the network, cgroup folders (for the rig's own test)."""
        ps = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=saigeedged.test={self.prefix}"],
                            capture_output=True, text=True, timeout=60).stdout.split()
        nets = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"name={self.network}"],
                              capture_output=True, text=True, timeout=60).stdout.split()
        return ps + nets + [str(p) for p in CGROUP.glob(f"*/{self.prefix}-n*")]


def _rmdirs(folder: Path) -> None:
    """Remove an (empty of processes) cgroup folder tree, deepest first: cgroupfs folders go by rmdir only."""
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory, docker_client: Any) -> Iterator[Cluster]:
    """Three nodes, up and idle, the stand-in images loaded in each; torn down after the session."""
    from conftest import STANDIN_ACUITY, STANDIN_MOBILINT

    from saigeedged.executor import feature

    cluster = Cluster(tmp_path_factory.mktemp("share"), [feature(STANDIN_ACUITY), feature(STANDIN_MOBILINT)],
                      [STANDIN_ACUITY, STANDIN_MOBILINT])
    try:
        cluster.start(3)
        yield cluster
    finally:
        cluster.teardown()

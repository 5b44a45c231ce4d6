"""executor: slurm against a real Slurm cluster of three node containers (tests/slurmcluster.py): the daemon runs on
the first node (the controller), container steps on whichever node Slurm places each attempt."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import STANDIN_ACUITY
from harness import STANDIN_QUANTIZE, STANDIN_RELEASE, read_status, wait_for
from slurmcluster import FAILING, Cluster, Node, slurm_cluster  # noqa: F401 - the session fixture
from slurmdaemon import ClusterDaemon

pytestmark = [pytest.mark.slurm, pytest.mark.docker]


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
    slurm_cluster.reset()


def calls(node: Node, d: ClusterDaemon, verb: str) -> list[str]:
    """The stand-in pegasus calls of `verb` in the node's cubie container of daemon `d` (cwd, argv)."""
    out = node.sh(f"docker exec {d.cubie} cat /tmp/standin-calls.log", check=False).stdout
    return [line for line in out.splitlines() if f"pegasus.py {verb}" in line]


def release(node: Node, d: ClusterDaemon) -> None:
    """End the stand-in's `untilreleased` quantize in daemon `d`'s cubie container on `node` (none there: nothing)."""
    node.sh(f"docker exec {d.cubie} touch {STANDIN_RELEASE}", check=False)


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
    """A cubie drop publishes its bundle; its pegasus steps ran in a node's container, placed by Slurm; a host drop
    compiles on the daemon's host and its report is made in the finishing stage; check, status, the dashboard and the
    metrics show the partition's nodes."""
    d = cluster_daemon(dashboard=True, metrics={"textfile": "metrics.prom"})
    d.drop("first")
    done = d.job("first")
    assert done["state"] == "succeeded", done
    assert (d.outbox / done["bundle"]["path"]).is_file()
    d.drop("onhost", target="host")  # on the daemon's host, its report in the finishing stage (STATUS= shows it there)
    host = d.job("onhost")
    assert host["state"] == "succeeded" and host["accuracy"]["method"] == "int8", host
    assert host["job_id"] in {e["job_id"] for e in d.events("job.finishing")}
    placed = d.events("job.placed")
    assert [e["job_id"] for e in placed] == [done["job_id"]]
    ran = [n for n in slurm_cluster.nodes.values() if any("first" in c for c in calls(n, d, "quantize"))]
    assert [n.name for n in ran] == [placed[0]["node"]]
    check = d.cli("check").stdout
    for name in slurm_cluster.nodes:
        assert f"{name}" in check and "serves cubie, mobilint" in check
    assert all(n in d.cli("status").stdout for n in slurm_cluster.nodes)  # status lists the partition's nodes
    wait_for(lambda: all(f'saigeedged_engine_up{{engine="{n}"}} 1.0' in _read(d.root / "metrics.prom")
                         for n in slurm_cluster.nodes), 60, "a metric per node")
    wait_for(lambda: all(n in _read(d.outbox / "index.html") for n in slurm_cluster.nodes), 60, "the nodes on the page")


def test_a_variant_sweep_runs_its_steps_on_the_node(cluster_daemon: Any, slurm_cluster: Cluster) -> None:  # noqa: F811
    """A cubie sweep of two variants on the partition: each variant asks for its steps in its own folder
    (work/.../variantN/.steps/), and the node's agent starts them there; the job succeeds in attempt 1 with both
    variants compiled on the node and evaluated."""
    d = cluster_daemon()
    d.drop("sweep", variants=[{"calibration_method": "minmax"}, {"calibration_method": "kl"}])
    done = d.job("sweep", timeout=300)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), done
    assert [r["variant"] for r in done["accuracy"]["variants"]] == [1, 2], done["accuracy"]
    assert sum(len([c for c in calls(n, d, "quantize") if "sweep" in c]) for n in slurm_cluster.nodes.values()) == 2


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def procs(node: Node, d: ClusterDaemon) -> str:
    """The processes in the node's cubie container of daemon `d`."""
    return node.sh(f"docker exec {d.cubie} ps -o args", check=False).stdout


def quantizing(d: ClusterDaemon, cluster: Cluster, name: str, marker: str) -> tuple[dict[str, Any], Node]:
    """Drop `name`; its status and node once its quantize step runs there (`marker` among the container's processes)."""
    d.drop(name)
    first = d.job(name, ("running",), step="quantize")
    node = running_on(cluster, first["job_id"])
    wait_for(lambda: marker in procs(node, d), 30, f"{name}'s quantize step running on its node")
    return first, node


def test_drops_spread_over_the_nodes_one_cubie_job_per_node(cluster_daemon: Any, slurm_cluster: Cluster) -> None:  # noqa: F811
    """Four cubie drops on three nodes: three run at once on three nodes, never two on one node, and all publish."""
    d = cluster_daemon()
    seen: list[dict[str, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                jobs = slurm_cluster.json("squeue")["jobs"]
            except (AssertionError, subprocess.SubprocessError, ValueError):  # one squeue that failed: the next one
                continue
            busy: dict[str, int] = {}
            for j in jobs:
                if j["job_state"] == "RUNNING" and "cubie" in j["tres_per_node"]:
                    busy[j["batch_host"]] = busy.get(j["batch_host"], 0) + 1
            seen.append(busy)
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    names = [f"spread{i}_untilreleased" for i in range(4)]
    for name in names:
        d.drop(name)

    def quantizing_now() -> int:
        docs = [read_status(d.outbox, p.stem) or {} for p in (d.outbox / "status").glob("spread*.json")]
        return sum(1 for doc in docs if (doc.get("state"), doc.get("step")) == ("running", "quantize"))

    try:
        wait_for(lambda: quantizing_now() == 3, 180, "three jobs quantizing at once")
        for node in slurm_cluster.nodes.values():
            release(node, d)  # the fourth job's node has the release too
        ends = [d.job(name, timeout=240) for name in names]
    finally:
        done.set()
        sampler.join()
    assert [e["state"] for e in ends] == ["succeeded"] * 4
    assert max(max(s.values(), default=0) for s in seen) == 1  # at most one cubie job per node at any time
    assert max(len(s) for s in seen) == 3  # and the three nodes busy at once
    assert {e["node"] for e in d.events("job.placed")} == set(slurm_cluster.nodes)


def test_a_node_killed_mid_step_requeues_the_job_which_publishes_once(cluster_daemon: Any,
                                                                       slurm_cluster: Cluster) -> None:  # noqa: F811
    """Power loss of the node running a quantize: Slurm requeues the job, attempt 2 runs elsewhere and publishes once."""
    d = cluster_daemon()
    slurm_cluster.drain(slurm_cluster.controller, True)  # the daemon's own host is not the one to die
    first, node = quantizing(d, slurm_cluster, "lost_sleep20", "sleep 20")
    try:
        slurm_cluster.kill(node)
        done = d.job("lost_sleep20", timeout=240)
        assert (done["state"], done["attempt"]) == ("succeeded", 2), d.tail()
        placed = [e["node"] for e in d.events("job.placed")]
        assert placed[0] == node.name and placed[-1] not in (node.name, slurm_cluster.controller.name)
        bundles = list((d.outbox).glob("lost_sleep20*.saigeedge"))
        assert [b.name for b in bundles] == [Path(done["bundle"]["path"]).name]
        assert [e["job_id"] for e in d.events("job.succeeded")] == [first["job_id"]]
    finally:
        slurm_cluster.drain(slurm_cluster.controller, False)
        slurm_cluster.revive(node)


def test_a_job_cancelled_while_requeued_leaves_no_cluster_job(cluster_daemon: Any,
                                                              slurm_cluster: Cluster) -> None:  # noqa: F811
    """The node running a quantize dies; Slurm requeues the cluster job for attempt 2, which waits for a node (the
    others drained) as the job waits in the daemon's queue; `saigeedged cancel` ends the job there. Its cluster job
    goes too: it stayed in Slurm's queue and would have run, holding a node's GRES until its --time, once one was
    back."""
    d = cluster_daemon()
    others = [n for n in slurm_cluster.nodes.values() if n is not slurm_cluster.controller]
    slurm_cluster.drain(slurm_cluster.controller, True)
    first, node = quantizing(d, slurm_cluster, "orphan_sleep60", "sleep 60")
    spare = [n for n in others if n is not node]
    try:
        for n in spare:
            slurm_cluster.drain(n, True)
        slurm_cluster.kill(node)
        wait_for(lambda: (read_status(d.outbox, first["job_id"]) or {}).get("state") == "queued", 120,
                 "the job requeued off the lost node", slurm_cluster.describe)
        assert [j["job_state"] for j in slurm_cluster.json("squeue")["jobs"] if j["name"] == first["job_id"]] \
            == ["PENDING"]
        assert d.cli("cancel", first["job_id"]).returncode == 0
        wait_for(lambda: [j["job_state"] for j in slurm_cluster.json("squeue")["jobs"] if j["name"] == first["job_id"]]
                 == ["CANCELLED"], 60, "its requeued cluster job cancelled", slurm_cluster.describe)
    finally:
        for n in [slurm_cluster.controller, *spare]:
            slurm_cluster.drain(n, False)
        slurm_cluster.revive(node)


def test_cancel_kills_the_step_in_the_nodes_container(cluster_daemon: Any, slurm_cluster: Cluster) -> None:  # noqa: F811
    """`saigeedged cancel` of a job mid-quantize ends it cancelled and its step is gone from the node's container."""
    d = cluster_daemon()
    first, node = quantizing(d, slurm_cluster, "cancelme_hang", "sleep 100000")
    assert d.cli("cancel", first["job_id"]).returncode == 0
    assert d.job("cancelme_hang")["state"] == "cancelled"
    wait_for(lambda: "sleep 100000" not in procs(node, d), 30, "the step gone from the node's container")
    assert not any(j["name"] == first["job_id"] and j["job_state"] == "RUNNING"
                   for j in slurm_cluster.json("squeue")["jobs"])


def test_daemon_killed_mid_step_reattaches_and_runs_the_step_once(cluster_daemon: Any,
                                                                   slurm_cluster: Cluster) -> None:  # noqa: F811
    """kill -9 of the daemon during a quantize on a node: the next daemon re-attaches, attempt 1, quantize ran once."""
    d = cluster_daemon()
    first, node = quantizing(d, slurm_cluster, "reattach_sleep12", "sleep 12")
    d.signal("KILL")
    d.start()
    done = d.job("reattach_sleep12")
    assert (done["state"], done["attempt"]) == ("succeeded", 1), d.tail()
    assert [e["job_id"] for e in d.events("job.reattached")] == [first["job_id"]]
    assert len([c for c in calls(node, d, "quantize") if "reattach_sleep12" in c]) == 1


def test_daemon_stopped_mid_step_leaves_the_step_running_and_reattaches(cluster_daemon: Any,
                                                                          slurm_cluster: Cluster) -> None:  # noqa: F811
    """`systemctl stop` (SIGTERM) during a quantize on a node: the cluster job and its step run on, the next daemon
    re-attaches in attempt 1 and the quantize ran once (docs/spec-executor-slurm.md, SPEC §15)."""
    d = cluster_daemon()
    first, node = quantizing(d, slurm_cluster, "stopped_untilreleased", STANDIN_QUANTIZE)
    d.stop()
    assert [e["job_id"] for e in d.events("job.detached")] == [first["job_id"]], d.tail()
    assert STANDIN_QUANTIZE in procs(node, d)  # the step outlives the daemon
    d.start()
    wait_for(lambda: d.events("job.reattached"), 60, "the re-attach")
    release(node, d)
    done = d.job("stopped_untilreleased")
    assert (done["state"], done["attempt"]) == ("succeeded", 1), d.tail()
    assert [e["job_id"] for e in d.events("job.reattached")] == [first["job_id"]]
    assert not d.events("job.requeued")
    assert len([c for c in calls(node, d, "quantize") if "stopped_untilreleased" in c]) == 1


def test_a_job_on_a_drained_node_reattaches_after_a_restart(cluster_daemon: Any,
                                                             slurm_cluster: Cluster) -> None:  # noqa: F811
    """The daemon stops mid-step and every node is drained meanwhile (maintenance: the running job keeps its node until
    it ends): the next daemon re-attaches the job and it completes in attempt 1. It waited for a free node to
    re-attach, and the drain waited for the job: neither ended before the cluster job's --time."""
    d = cluster_daemon()
    first, node = quantizing(d, slurm_cluster, "drained_untilreleased", STANDIN_QUANTIZE)
    d.stop()
    try:
        for n in slurm_cluster.nodes.values():
            slurm_cluster.drain(n, True)
        d.start()
        wait_for(lambda: d.events("job.reattached"), 60, "the job re-attached", d.tail)
        release(node, d)
        done = d.job("drained_untilreleased")
        assert (done["state"], done["attempt"]) == ("succeeded", 1), d.tail()
    finally:
        for n in slurm_cluster.nodes.values():
            slurm_cluster.drain(n, False)


def test_a_stop_while_the_cluster_job_waits_for_a_node_keeps_its_place(cluster_daemon: Any,
                                                                        slurm_cluster: Cluster) -> None:  # noqa: F811
    """`systemctl stop` while the attempt's cluster job is still queued (another user's jobs hold every node's cubie
    GRES): it stays in Slurm's queue, the next daemon waits for that same cluster job, and the job succeeds in attempt
    1 (a stop spent the attempt and cancelled the queued cluster job, whose place a new submission lost)."""
    d = cluster_daemon()
    # nodes up but busy: the daemon sees room and submits, Slurm queues it (drained nodes: the daemon never submits)
    blockers = [int(slurm_cluster.controller.sh("sbatch --parsable --partition=saige --gres=cubie:1 --nodes=1 "
                                                "--output=/dev/null --chdir=/ --wrap 'sleep 600'").stdout.split(";")[0])
                for _ in slurm_cluster.nodes]

    def states() -> dict[int, str]:
        return {int(j["job_id"]): str(j["job_state"]) for j in slurm_cluster.json("squeue")["jobs"]}

    wait_for(lambda: all("RUNNING" in states().get(b, "") for b in blockers), 60, "the other user's jobs running")
    d.drop("queued_stop")
    job_id = d.job("queued_stop", ("running",))["job_id"]

    def queued() -> int | None:
        jobs = slurm_cluster.json("squeue")["jobs"]
        return next((int(j["job_id"]) for j in jobs if j["name"] == job_id and "PENDING" in str(j["job_state"])), None)

    cluster_id = wait_for(queued, 60, f"{job_id}'s cluster job queued")
    d.stop()
    assert [e["job_id"] for e in d.events("job.detached")] == [job_id], d.tail()
    assert queued() == cluster_id  # left in the queue
    d.start()
    slurm_cluster.controller.sh(f"scancel {' '.join(map(str, blockers))}")
    done = d.job("queued_stop")
    assert (done["state"], done["attempt"]) == ("succeeded", 1), d.tail()
    assert [e["cluster_id"] for e in d.events("job.placed")] == [cluster_id]
    assert [e["job_id"] for e in d.events("job.reattached")] == [job_id] and not d.events("job.requeued")


def test_slurmctld_down_mid_step_the_job_completes(cluster_daemon: Any, slurm_cluster: Cluster) -> None:  # noqa: F811
    """The controller stops while a quantize runs on a node, and stays down until the daemon has seen it not answer
    (squeue --json then exits 0 with no jobs and an `errors` list: that read as "no cluster job" ended the attempt
    ENGINE_LOST); then it starts again: the job completes in its first attempt, the journal says the outage once."""
    d = cluster_daemon()
    first, node = quantizing(d, slurm_cluster, "ctld_untilreleased", STANDIN_QUANTIZE)
    slurm_cluster.stop_controller()
    try:
        wait_for(lambda: d.events("slurm.unavailable"), 120, "the daemon to see slurmctld not answering", d.tail)
    finally:
        slurm_cluster.start_controller()
    wait_for(lambda: d.events("slurm.available"), 120, "the daemon to see slurmctld answer again", d.tail)
    release(node, d)
    done = d.job("ctld_untilreleased")
    assert (done["state"], done["attempt"], done["job_id"]) == ("succeeded", 1, first["job_id"]), d.tail()


def test_a_partitioned_nodes_stale_attempt_never_publishes(cluster_daemon: Any, slurm_cluster: Cluster) -> None:  # noqa: F811
    """A node cut off mid-step: attempt 2 runs elsewhere and publishes once; the cut node's step is gone after it returns."""
    d = cluster_daemon()
    slurm_cluster.drain(slurm_cluster.controller, True)
    first, node = quantizing(d, slurm_cluster, "cut_sleep60", "sleep 60")
    try:
        slurm_cluster.cut(node)
        wait_for(lambda: (read_status(d.outbox, first["job_id"]) or {}).get("attempt") == 2, 120, "attempt 2")
        slurm_cluster.heal(node)
        done = d.job("cut_sleep60", timeout=240)
        # attempt 3 when Slurm placed attempt 2 on the returned node while the stale copy still ran there: that launch
        # fails (duplicate job), Slurm holds the job and drains the node, the daemon releases it (the next test)
        assert done["state"] == "succeeded" and done["attempt"] >= 2, d.tail()
        wait_for(lambda: "sleep 60" not in procs(node, d), 60, "the stale step gone from the returned node")
        assert [b.name for b in d.outbox.glob("cut_sleep60*.saigeedge")] == [Path(done["bundle"]["path"]).name]
        assert len(d.events("job.succeeded")) == 1
    finally:
        slurm_cluster.drain(slurm_cluster.controller, False)
        slurm_cluster.heal(node)
        with contextlib.suppress(AssertionError):  # the next test's trouble, not a mask over this test's failure
            wait_for(lambda: "down" not in slurm_cluster.states()[node.name], 60, f"{node.name} back in service")


def test_a_job_held_after_a_failed_launch_runs_on_another_node(cluster_daemon: Any, slurm_cluster: Cluster) -> None:  # noqa: F811
    """A node that cannot launch the attempt (its prolog fails; a stale copy of the job on a node back from a partition
    does the same): Slurm holds the job `launch failed requeued held` and drains the node. The attempt is spent
    (ENGINE_LOST, as any requeue); the daemon releases the held job and the next attempt runs on another node."""
    d = cluster_daemon()
    bad, good, *rest = [n for n in slurm_cluster.nodes.values() if n is not slurm_cluster.controller]
    for node in (slurm_cluster.controller, good, *rest):
        slurm_cluster.drain(node, True)
    bad.sh(f"touch {FAILING}")
    d.drop("held")
    wait_for(lambda: "drain" in slurm_cluster.states()[bad.name], 120, f"{bad.name} drained by its failed launch")
    slurm_cluster.drain(good, False)
    done = d.job("held", timeout=120)
    assert (done["state"], done["attempt"]) == ("succeeded", 2), d.tail()
    assert [e["node"] for e in d.events("job.placed")] == [good.name]
    [held] = d.events("job.launch_failed")
    assert (held["attempt"], held["reason"]) == (2, "launch failed requeued held")
    [lost] = d.events("job.requeued")  # attempt 1's end says why
    assert lost["error_code"] == "ENGINE_LOST" and "Slurm requeued cluster job" in lost["message"], lost
    assert "launch failed requeued held" in lost["message"]


def test_a_node_that_joins_takes_work_without_a_restart(cluster_daemon: Any, slurm_cluster: Cluster) -> None:  # noqa: F811
    """Three nodes busy with cubie jobs and a fourth job queued: a node joins (slurmd -Z) and the fourth runs there."""
    d = cluster_daemon()
    for i in range(3):
        d.drop(f"join{i}_untilreleased")
    for i in range(3):
        d.job(f"join{i}_untilreleased", ("running",), step="quantize")
    d.drop("join3")
    d.job("join3", ("queued",))
    busy = list(slurm_cluster.nodes.values())
    try:
        new = slurm_cluster.join(len(slurm_cluster.nodes) + 1)
        done = d.job("join3", timeout=120)
    finally:
        for node in busy:
            release(node, d)
    assert done["state"] == "succeeded"
    assert [e["node"] for e in d.events("job.placed") if e["job_id"] == done["job_id"]] == [new.name]
    assert new.name in d.cli("check").stdout  # check lists the node that joined


def test_a_node_that_lacks_the_image_is_left_out_and_the_job_runs_elsewhere(cluster_daemon: Any,  # noqa: F811
                                                                            slurm_cluster: Cluster) -> None:  # noqa: F811
    """A node whose feature names the image but whose engine lacks it (loaded under another tag, removed by hand):
    Slurm places the attempt there first (the lowest Weight), its agent cannot make the container. The job failed
    IMAGE_NOT_FOUND, and so did every job after it that Slurm placed there. Now the node is left out of this daemon's
    next cluster jobs (the dashboard says why) and the job goes back to the queue, unspent, and runs on another node;
    the next drop never goes there."""
    d = cluster_daemon(dashboard=True)
    bad = next(n for n in slurm_cluster.nodes.values() if n is not slurm_cluster.controller)
    bad.docker("image", "tag", STANDIN_ACUITY, "saige-aside:1")
    bad.docker("rmi", STANDIN_ACUITY)
    slurm_cluster.prefer(bad)
    try:
        d.drop("unloaded")
        done = d.job("unloaded", timeout=120)
        wait_for(lambda: "left out of cubie target&#x27;s jobs: on node" in _read(d.outbox / "index.html"), 60,
                 "the node left out on the page")
        checked = d.cli("check").stdout  # another process: from the daemon's state dir
        assert "left out of cubie target's jobs by the daemon until" in checked and bad.name in checked, checked
        d.drop("after")
        after = d.job("after", timeout=120)
        d.stop()  # a restart remembers the node left out (the state dir keeps it)
        d.start()
        d.drop("restarted")
        restarted = d.job("restarted", timeout=120)
    finally:
        bad.docker("image", "tag", "saige-aside:1", STANDIN_ACUITY)
        bad.docker("rmi", "saige-aside:1")
        slurm_cluster.prefer(None)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), d.tail()  # no attempt spent on the node
    [left] = d.events("job.node_left_out")
    assert (left["node"], left["error_code"], left["job_id"]) == (bad.name, "IMAGE_NOT_FOUND", done["job_id"])
    [back] = d.events("job.requeued")
    assert back["error_code"] == "DOCKER_UNAVAILABLE" and f"{bad.name} is left out" in back["message"], back
    for job in (done, after):  # nothing left in the share: the agents' logs (removed when ready, or at the end) and
        assert not (d.root / "work" / job["job_id"]).exists()  # the ready files were all the job folder held
    assert (after["state"], after["attempt"]) == ("succeeded", 1)
    assert (restarted["state"], restarted["attempt"]) == ("succeeded", 1)
    assert bad.name not in [e["node"] for e in d.events("job.placed")]


def test_a_node_without_its_engine_is_left_out_for_every_target(cluster_daemon: Any,  # noqa: F811
                                                               slurm_cluster: Cluster) -> None:  # noqa: F811
    """dockerd gone on the node Slurm picks first: its agent says DOCKER_UNAVAILABLE, the node is left out for every
    target, the job runs elsewhere without spending an attempt, and a mobilint drop after it never goes there."""
    d = cluster_daemon()
    bad = next(n for n in slurm_cluster.nodes.values() if n is not slurm_cluster.controller)
    bad.sh("pkill -x dockerd; for _ in $(seq 100); do pgrep -x dockerd >/dev/null || break; sleep 0.1; done")
    slurm_cluster.prefer(bad)
    try:
        d.drop("noengine")
        done = d.job("noengine", timeout=120)
        d.drop("noengine_mob", target="mobilint", device="aries-rb")
        mobilint = d.job("noengine_mob", timeout=120)
    finally:
        slurm_cluster.revive_engine(bad)
        slurm_cluster.prefer(None)
    assert (done["state"], done["attempt"]) == ("succeeded", 1), d.tail()
    assert [(e["node"], e["error_code"], e["target"]) for e in d.events("job.node_left_out")] \
        == [(bad.name, "DOCKER_UNAVAILABLE", None)]
    assert (mobilint["state"], mobilint["attempt"]) == ("succeeded", 1), mobilint
    assert bad.name not in [e["node"] for e in d.events("job.placed")]

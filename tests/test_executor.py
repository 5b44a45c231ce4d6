"""The executor section and the pure rules of executor slurm (saigeedged/executor.py), and how Slurm's JSON is read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from conftest import write_config

from saigeedged import config as configmod
from saigeedged.adapters.slurm import cluster
from saigeedged.errors import SaigeError
from saigeedged.executor import ClusterJob, ClusterNode, ExecutorSpec, capacity, feature, minutes, serves


def test_no_executor_key_is_the_local_engine_and_its_work_root(tmp_path: Path) -> None:
    """Without `executor:` nothing changes for one host: executor local, work dirs under state_dir."""
    config = configmod.load(write_config(tmp_path))
    assert config.executor == ExecutorSpec() and not config.executor.slurm
    assert config.work_root == tmp_path / "state" / "work"


def test_executor_slurm_puts_the_work_root_on_the_share(tmp_path: Path) -> None:
    """executor slurm: the attempts' work dirs live on the work share, at the same path on every host."""
    config = configmod.load(write_config(tmp_path, executor={"kind": "slurm", "partition": "saige",
                                                             "work_share": "/srv/saige/work"}))
    assert config.executor.slurm and config.work_root == Path("/srv/saige/work")


@pytest.mark.parametrize("section, field", [
    ({"kind": "k8s"}, "executor.kind"),
    ({"kind": "slurm", "partition": "saige"}, "executor.work_share"),
    ({"kind": "slurm", "partition": "saige", "work_share": "work"}, "executor.work_share"),
    ({"kind": "slurm", "work_share": "/srv/saige/work"}, "executor.partition"),
    ({"kind": "slurm", "partition": "a b", "work_share": "/srv/saige/work"}, "executor.partition"),
    ({"max_jobs": 0}, "executor.max_jobs"),
])
def test_a_bad_executor_fails_at_load_naming_the_key(tmp_path: Path, section: dict[str, Any], field: str) -> None:
    """A bad executor section is MANIFEST_INVALID at load, naming the key, with a hint to the spec."""
    with pytest.raises(SaigeError) as err:
        configmod.load(write_config(tmp_path, executor=section))
    assert err.value.code == "MANIFEST_INVALID" and f"config {field}" in err.value.message
    assert "executor" in err.value.hint


def test_an_image_feature_is_a_word_slurm_takes() -> None:
    """The image's feature keeps letters, digits, . _ - and replaces what Slurm's expressions use (: / & |)."""
    assert feature("ubuntu-npu:v2.0.10.1") == "img-ubuntu-npu_v2.0.10.1"
    assert feature("mobilint/qbcompiler:1.3-cpu-ubuntu22.04") == "img-mobilint_qbcompiler_1.3-cpu-ubuntu22.04"


def test_the_time_limit_never_ends_a_job_before_its_own_timeout() -> None:
    """--time is in whole minutes, rounded up and one more: the daemon's job timeout always comes first."""
    assert [minutes(s) for s in (1, 60, 61, 14400)] == [2, 2, 3, 241]


def test_capacity_counts_up_nodes_with_the_gres_and_the_image() -> None:
    """A target's room is one job per up node that has its GRES and its image's feature; drained, down, reserved or
    rebooting nodes and nodes without the image add none (the old count took a node in a maintenance reservation for
    room: a job was taken and waited there)."""
    img = feature("npu:1")
    nodes = [ClusterNode("a", "idle", {"cubie": 1}, ("cubie", img)),
             ClusterNode("b", "mixed", {"cubie": 1, "mobilint": 1}, (img,)),
             ClusterNode("c", "idle drain", {"cubie": 1}, (img,)),
             ClusterNode("d", "down not_responding", {"cubie": 1}, (img,)),
             ClusterNode("e", "idle", {"cubie": 1}, ("img-other",)),
             # in a maintenance or another reservation, to reboot: takes none of ours
             *(ClusterNode(f"x{i}", state, {"cubie": 1}, (img,)) for i, state in enumerate(
                 ("idle maintenance reserved", "idle reserved", "mixed reboot_requested")))]
    assert capacity(nodes, "cubie", "npu:1") == 2
    assert capacity(nodes, "mobilint", "npu:1") == 1
    assert serves(nodes[2], {"cubie": "npu:1", "mobilint": "npu:1"}) == ("cubie",)  # what it has, down or not


def test_squeue_and_sinfo_json_are_read_as_the_cluster_says() -> None:
    """A requeued job's attempt is the one submitted plus Slurm's restarts; a node's state words include its flags; a
    node of another partition is not ours."""
    answers = {"squeue": {"jobs": [
        {"job_id": 7, "name": "det-1", "job_state": "RUNNING", "restart_cnt": 1, "comment": "attempt=2",
         "batch_host": "n2", "state_reason": "None"},
        {"job_id": 8, "name": "other", "job_state": "PENDING", "restart_cnt": 0, "comment": "", "nodes": ""}]},
        "sinfo": {"nodes": [{"name": "n2", "state": "idle", "state_flags": ["DRAIN"], "gres": "cubie:1,mobilint:1(S:0)",
                             "active_features": "cubie,img-x", "reason": "test", "partitions": ["debug", "saige"]},
                            {"name": "n9", "state": "idle", "gres": "cubie:1", "active_features": "cubie,img-x",
                             "partitions": ["gpu"]}]}}  # sinfo --json lists every partition's nodes

    def run(argv: Any, stdin: str | None) -> str:
        import json

        return json.dumps(answers[argv[0]])

    slurm = cluster.Slurm(ExecutorSpec("slurm", "saige", Path("/w")), run)
    assert slurm.poll("det-1") == [ClusterJob(7, "det-1", "RUNNING", 1, 2, "n2", "None")]
    assert slurm.poll("det-1")[0].attempt == 3 and slurm.poll("det-1")[0].alive
    (node,) = slurm.nodes()
    assert (node.name, node.up, node.gres, node.features) == ("n2", False, {"cubie": 1, "mobilint": 1}, ("cubie", "img-x"))


def test_slurm_23_11_lists_states_and_features() -> None:
    """Slurm 23.11 on gives a job's state as a list (22.05: a string): read as one string, `["RUNNING"]` was no live
    state, so every attempt looked gone. A node's state and features as lists are read too (the shape of `scontrol
    show nodes --json`). Since 23.02 `sinfo --json` groups its nodes (`{"sinfo": [...]}`), which is not read: said, as
    Slurm not answering (no job taken), never "no node"."""
    import json

    answers = {"squeue": {"errors": [], "jobs": [
        {"job_id": 7, "name": "det-1", "job_state": ["RUNNING"], "restart_cnt": 0, "comment": "attempt=1"},
        {"job_id": 8, "name": "det-1", "job_state": ["PENDING", "REQUEUED"], "restart_cnt": 1, "comment": "attempt=1"},
        {"job_id": 9, "name": "det-1", "job_state": ["COMPLETED", "COMPLETING"], "restart_cnt": 0,
         "comment": "attempt=1"}]},
        "sinfo": {"errors": [], "nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"], "gres": "cubie:1",
                                           "active_features": ["cubie", "img-x"], "partitions": ["saige"]}]}}

    def run(argv: Any, stdin: str | None) -> str:
        return json.dumps(answers[argv[0]])

    slurm = cluster.Slurm(ExecutorSpec("slurm", "saige", Path("/w")), run)
    assert [(j.state, j.alive) for j in slurm.poll("det-1")] == [("RUNNING", True), ("PENDING", True),
                                                                   ("COMPLETING", True)]
    (node,) = slurm.nodes()
    assert (node.state, node.up, node.features) == ("idle drain", False, ("cubie", "img-x"))
    answers["sinfo"] = {"meta": {"Slurm": {"release": "23.11.4"}}, "errors": [], "sinfo": [{"node": {"state": ["IDLE"]}}]}
    with pytest.raises(SaigeError) as grouped:
        slurm.nodes(fresh=True)
    assert grouped.value.code == "DOCKER_UNAVAILABLE" and "Slurm 23.11.4's `sinfo --json` groups" in grouped.value.message


def test_a_controller_that_does_not_answer_is_not_an_empty_cluster() -> None:
    """Slurm 22.05's squeue and sinfo --json exit 0 when slurmctld does not answer, with no jobs and the failure under
    `errors` (their answer verbatim below): read as the truth, every running attempt looked gone (ENGINE_LOST) during a
    controller outage. It is DOCKER_UNAVAILABLE (wait, no attempt spent), said once in the journal until an answer."""
    import json

    meta = {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
            "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}}
    down = {"squeue": {"meta": meta, "errors": [{"description": "Failed while looking for jobs", "error_number": -1,
                                                 "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []},
            "sinfo": {"meta": meta, "errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []}}
    up = {"squeue": {"meta": meta, "errors": [], "jobs": [{"job_id": 7, "name": "det-1", "job_state": "RUNNING",
                                                           "comment": "attempt=1"}]},
          "sinfo": {"meta": meta, "errors": [], "nodes": []}}
    answers = [down]

    def run(argv: Any, stdin: str | None) -> str:
        return json.dumps(answers[0][argv[0]]) if answers[0] else "<html>proxy error</html>"

    slurm = cluster.Slurm(ExecutorSpec("slurm", "saige", Path("/w")), run)
    with structlog.testing.capture_logs() as said:
        for ask in (lambda: slurm.poll("det-1", fresh=True), lambda: slurm.nodes(fresh=True)):
            with pytest.raises(SaigeError) as failed:
                ask()
            assert failed.value.code == "DOCKER_UNAVAILABLE" and "Unspecified error" in failed.value.message
        answers[0] = {}
        with pytest.raises(SaigeError, match="answered no JSON object: <html>"):
            slurm.poll("det-1", fresh=True)
        answers[0] = up
        assert [j.cluster_id for j in slurm.poll("det-1", fresh=True)] == [7]
    assert [e["event"] for e in said] == ["slurm.unavailable", "slurm.available"]
    assert said[0]["message"] == ("cannot reach Slurm: `squeue --json`: slurm_load_jobs Failed while looking for jobs "
                                  "Unspecified error")


@pytest.mark.parametrize("stderr, code", [
    ("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
     "CONTAINER_FAILED"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     "CONTAINER_FAILED"),
    ("sbatch: error: Batch job submission failed: Access/permission denied", "CONTAINER_FAILED"),
    ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", "DOCKER_UNAVAILABLE"),
    ("sbatch: error: Batch job submission failed: Required partition not available (inactive or drain)",
     "DOCKER_UNAVAILABLE"),  # an admin's drain of the partition: it ends
    ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size "
     "and/or time limits)", "DOCKER_UNAVAILABLE"),  # a submit limit: it clears as jobs end
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
     "DOCKER_UNAVAILABLE")])
def test_a_cluster_job_slurm_refuses_fails_the_job_and_an_outage_waits(tmp_path: Path, stderr: str, code: str) -> None:
    """sbatch exits 1 both when slurmctld does not answer (wait, no attempt spent) and when it refuses the job for good
    (a partition's MaxTime under limits.job_timeout_s, an account the service's user lacks): that one was read as an
    outage too, and the job was taken, refused and requeued at once, for ever. It fails the job, saying what to fix."""
    script = tmp_path / "sbatch"
    script.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
    script.chmod(0o755)
    with pytest.raises(SaigeError) as caught:
        cluster.run_command([str(script), "--parsable"], "#!/bin/sh\n")
    assert caught.value.code == code
    if code == "CONTAINER_FAILED":
        assert caught.value.message == f"Slurm refused the cluster job: {stderr.split('failed: ')[1]}"
        assert "limits.job_timeout_s" in caught.value.hint


def test_a_change_of_ours_is_never_followed_by_an_answer_from_before_it() -> None:
    """squeue's answer is shared for poll_interval_s, but not across a change the daemon made: after a submit, a
    cancel or lifting a requeued job's hold (StartTime=now) the next poll asks Slurm again. A cached BeginTime after
    the lift made the node's wait issue `scontrol update` at every look for up to poll_interval_s."""
    calls: list[str] = []
    reason = ["BeginTime"]

    def run(argv: Any, stdin: str | None) -> str:
        import json

        calls.append(argv[0])
        if argv[0] == "scontrol":  # the hold lifted: Slurm no longer gives BeginTime as the reason
            reason[0] = "None"
        if argv[0] != "squeue":
            return "7\n"
        return json.dumps({"jobs": [{"job_id": 7, "name": "det-1", "job_state": "PENDING", "restart_cnt": 1,
                                     "comment": "attempt=1", "state_reason": reason[0]}]})

    slurm = cluster.Slurm(ExecutorSpec("slurm", "saige", Path("/w"), poll_interval_s=60.0), run)
    assert slurm.poll("det-1")[0].reason == "BeginTime"
    assert slurm.poll("det-1")[0].reason == "BeginTime" and calls.count("squeue") == 1  # shared within the interval
    slurm.start_now(7)
    assert slurm.poll("det-1")[0].reason == "None" and calls.count("squeue") == 2
    slurm.cancel(7)
    slurm.poll("det-1")
    assert calls.count("squeue") == 3


def test_a_job_slurm_held_after_a_failed_launch_is_told_from_a_hold_of_an_operator() -> None:
    """slurmd's requeue of a job it could not launch holds it with the description `launch failed requeued held`: the
    daemon releases that one (scontrol release, then squeue asked afresh), never a hold an operator placed."""
    calls: list[list[str]] = []
    held = {"job_id": 7, "name": "det-1", "job_state": "PENDING", "restart_cnt": 2, "comment": "attempt=1",
            "state_reason": "JobHeldUser", "state_description": "launch failed requeued held"}
    mine = {**held, "job_id": 8, "state_description": ""}  # `scontrol hold 8`

    def run(argv: Any, stdin: str | None) -> str:
        import json

        calls.append(list(argv))
        return json.dumps({"jobs": [held, mine]}) if argv[0] == "squeue" else ""

    slurm = cluster.Slurm(ExecutorSpec("slurm", "saige", Path("/w"), poll_interval_s=60.0), run)
    failed, operators = slurm.poll("det-1")
    assert failed.launch_failed and failed.attempt == 3 and failed.alive
    assert failed.describe() == "PENDING: launch failed requeued held"
    assert not operators.launch_failed and operators.describe() == "PENDING: JobHeldUser"
    slurm.release(7)
    slurm.poll("det-1")
    assert calls[1] == ["scontrol", "release", "7"] and [c[0] for c in calls].count("squeue") == 2


def _node(tmp_path: Path, job: Any, cluster_jobs: list[dict[str, Any]], calls: list[list[str]]) -> Any:
    """A NodeContainer serving `job` on a fake Slurm whose squeue lists `cluster_jobs` (every call kept in `calls`)."""
    import json

    from saigeedged.adapters.slurm.node import NodeContainer

    def run(argv: Any, stdin: str | None) -> str:
        calls.append(list(argv))
        return json.dumps({"jobs": cluster_jobs}) if argv[0] == "squeue" else ""

    config = configmod.load(write_config(tmp_path, executor={"kind": "slurm", "partition": "saige",
                                                             "work_share": str(tmp_path / "work")}))
    work = tmp_path / "work" / job.job_id / f"attempt{job.attempt}"
    work.mkdir(parents=True)
    return NodeContainer(config, cluster.Slurm(config.executor, run), "cubie", lambda: (job, work), lambda: None)


def _job(state: str = "running", started_at: str = "2026-01-01T00:00:00Z") -> Any:
    from saigeedged.jobs import Job

    return Job(job_id="det-1", name="det", target="cubie", task="detection", entry={"onnx": "/x.onnx"}, subdir="",
               claim_dir="/c/det-1", manifest="det.yml", priority=0, created_at="t", state=state, attempt=1,
               attempts=[{"engine": "slurm", "started_at": started_at, "finished_at": None, "error": None}])


@pytest.mark.parametrize("state, cancelled", [("failed", [["scancel", "7"]]), ("queued", [])])
def test_a_failed_job_leaves_no_cluster_job_behind(tmp_path: Path, state: str, cancelled: list[list[str]]) -> None:
    """An attempt that ends the job failed (its last attempt lost to a requeue, say) cancels the job's cluster job
    still queued or held: no attempt will take it. Requeued for a next attempt, it is left for that attempt."""
    held = {"job_id": 7, "name": "det-1", "job_state": "PENDING", "restart_cnt": 1, "comment": "attempt=1",
            "state_reason": "JobHeldUser", "state_description": "launch failed requeued held"}
    calls: list[list[str]] = []
    node = _node(tmp_path, _job(state), [held], calls)
    node.end_job(node.current()[1])
    assert [c for c in calls if c[0] == "scancel"] == cancelled


@pytest.mark.timeout(30)  # the old code waited for the new cluster job's agent to run a step it never runs
def test_an_attempt_whose_node_was_lost_while_the_daemon_was_away_is_lost(tmp_path: Path) -> None:
    """A daemon re-attaches an attempt a node served (its ready file is there) and no cluster job serves it: its node
    died while the daemon was stopped and Slurm requeued the cluster job (it now counts for attempt 2). The old code
    cancelled that job and submitted a new one for attempt 1, whose agent found the step asked for and never ran it:
    the job hung until its --time. It is ENGINE_LOST (retried), and the requeued job is left to serve attempt 2."""
    from saigeedged.adapters.slurm.agent import ready_path

    requeued = {"job_id": 7, "name": "det-1", "job_state": "PENDING", "restart_cnt": 1, "comment": "attempt=1",
                "state_reason": "BeginTime"}
    calls: list[list[str]] = []
    node = _node(tmp_path, _job(), [requeued], calls)
    job, work = node.current()
    ready_path(work.parent, 1).write_text('{"node": "n1"}')
    with pytest.raises(SaigeError) as caught:
        node.ensure()
    assert caught.value.code == "ENGINE_LOST" and "7 PENDING: BeginTime for attempt 2" in caught.value.message
    assert [c[0] for c in calls] == ["squeue"]  # no scancel of the requeued job, no sbatch


def test_a_shared_answer_from_before_the_agent_started_does_not_lose_the_attempt(tmp_path: Path) -> None:
    """squeue's answer is shared for poll_interval_s: the last one the node's wait read says PENDING, the agent then
    starts the step. With a poll_interval_s above the 2 s between liveness looks, the first look read that answer
    and ended the running attempt ENGINE_LOST. A look that finds the attempt not running asks Slurm afresh first."""
    import json

    from saigeedged.adapters.slurm.node import NodeContainer

    state = ["PENDING"]

    def run(argv: Any, stdin: str | None) -> str:
        return json.dumps({"jobs": [{"job_id": 7, "name": "det-1", "job_state": state[0], "restart_cnt": 0,
                                     "comment": "attempt=1"}]})

    config = configmod.load(write_config(tmp_path, executor={"kind": "slurm", "partition": "saige", "poll_interval_s": 60,
                                                             "work_share": str(tmp_path / "work")}))
    job = _job()
    node = NodeContainer(config, cluster.Slurm(config.executor, run), "cubie", lambda: (job, tmp_path), lambda: None)
    assert node.slurm.poll("det-1")[0].state == "PENDING"  # the node's wait, just before its agent was ready
    state[0] = "RUNNING"

    class Running:  # the step's follower: no exit code yet
        @staticmethod
        def _look() -> None:
            return None

    assert node._gone(Running()) is False  # type: ignore[arg-type]


def test_a_node_that_cannot_make_its_container_is_named(tmp_path: Path) -> None:
    """The agent's error (its node lacks the image) fails the job with the local engine's code, naming the node: the
    message said "on its node", and an operator could not tell which node to load the image on or drain."""
    import json

    from saigeedged.adapters.slurm.agent import ready_path

    running = {"job_id": 7, "name": "det-1", "job_state": "RUNNING", "restart_cnt": 0, "comment": "attempt=1"}
    node = _node(tmp_path, _job(), [running], [])
    job, work = node.current()
    error = SaigeError("IMAGE_NOT_FOUND", "image npu:1 is not loaded").as_dict(None)
    ready_path(work.parent, 1).write_text(json.dumps({"error": error, "node": "cn07"}))
    with pytest.raises(SaigeError) as caught:
        node.ensure()
    assert (caught.value.code, caught.value.message) == ("IMAGE_NOT_FOUND", "on node cn07: image npu:1 is not loaded")
    # read by a daemon started after the agent had said so and ended: its word, not ENGINE_LOST (an attempt spent)
    (tmp_path / "restarted").mkdir()
    after = _node(tmp_path / "restarted", _job(), [], [])
    ready_path(after.current()[1].parent, 1).write_text(json.dumps({"error": error, "node": "cn07"}))
    with pytest.raises(SaigeError) as caught:
        after.ensure()
    assert (caught.value.code, caught.value.message) == ("IMAGE_NOT_FOUND", "on node cn07: image npu:1 is not loaded")


def test_the_end_of_a_requeued_attempt_removes_its_own_ready_file(tmp_path: Path) -> None:
    """A lost attempt is requeued (job.attempt moves on) before its container is released: the end removed the next
    attempt's ready file (which that attempt's agent may have written already: then its worker waited for it until
    TIMEOUT) and left the lost one's on the share."""
    from saigeedged.adapters.slurm.agent import ready_path

    node = _node(tmp_path, _job(), [], [])
    job, work = node.current()
    ready_path(work.parent, 1).write_text('{"node": "n1"}')
    ready_path(work.parent, 2).write_text('{"node": "n2"}')
    job.attempt = 2  # Jobs.requeue
    node.end_job(work)
    assert not ready_path(work.parent, 1).exists() and ready_path(work.parent, 2).exists()


@pytest.mark.timeout(30)  # without the bound the wait never ends
def test_a_cluster_job_never_placed_ends_with_the_jobs_time(tmp_path: Path) -> None:
    """A cluster job Slurm keeps pending (every node that serves it drained) does not hold the worker past
    limits.job_timeout_s since the attempt began: TIMEOUT, saying what Slurm said."""
    pending = {"job_id": 7, "name": "det-1", "job_state": "PENDING", "restart_cnt": 0, "comment": "attempt=1",
               "state_reason": "ReqNodeNotAvail"}
    node = _node(tmp_path, _job(), [pending], [])
    with pytest.raises(SaigeError) as caught:
        node.ensure()
    assert caught.value.code == "TIMEOUT" and "PENDING: ReqNodeNotAvail" in caught.value.message


@pytest.mark.timeout(30)  # a cancel on the caller's thread waits on the blocked squeue for ever
def test_giving_up_on_cluster_jobs_never_waits_on_slurm(tmp_path: Path) -> None:
    """The start-up (before READY=1) and the main loop give attempts up on a controller that does not answer: the
    squeue and scancel run on a thread of their own; once Slurm answers, the cluster job of the attempt given up on is
    cancelled, not the next attempt's that a worker submitted meanwhile."""
    import json
    import threading

    from saigeedged.jobs import Attempt
    from saigeedged.service.clusterslots import cancel_behind

    answering = threading.Event()
    calls: list[list[str]] = []

    def run(argv: Any, stdin: str | None) -> str:
        answering.wait()
        calls.append(list(argv))
        given_up = {"job_id": 7, "name": "det-1", "job_state": "RUNNING", "restart_cnt": 0, "comment": "attempt=1"}
        submitted = {"job_id": 8, "name": "det-1", "job_state": "PENDING", "restart_cnt": 0, "comment": "attempt=2"}
        return json.dumps({"jobs": [given_up, submitted]}) if argv[0] == "squeue" else ""

    config = configmod.load(write_config(tmp_path, executor={"kind": "slurm", "partition": "saige",
                                                             "work_share": str(tmp_path / "work")}))
    behind = cancel_behind(cluster.Slurm(config.executor, run), [Attempt("det-1", 1, "slurm", 1)])
    assert behind.is_alive() and calls == []  # returned while Slurm has not answered
    answering.set()
    behind.join(20)
    assert [c[:2] for c in calls] == [["squeue", "--all"], ["scancel", "7"]]


@pytest.mark.parametrize("superseded", [False, True])
def test_a_step_on_a_node_is_recorded_before_it_is_asked_for(tmp_path: Path, superseded: bool) -> None:
    """The attempt's record (the worker's book) says step 1 was asked for, on which cluster job and node, before its
    request reaches the share: a daemon stopped after it leaves the step running (re-attached, not requeued). An
    attempt the store has moved past raises there, and no request is written."""
    from saigeedged.adapters.docker.detached import FileBook
    from saigeedged.jobs import Superseded

    recorded: list[tuple[int, str, bool]] = []

    class Book(FileBook):
        def launched(self, work: Path, n: int, exec_id: str) -> None:
            if superseded:
                raise Superseded("attempt 1 is not the store's any more")
            recorded.append((n, exec_id, (work / ".steps" / f"{n}.req").exists()))
            super().launched(work, n, exec_id)

    node = _node(tmp_path, _job(), [], [])
    node.book, node.cluster_id, node.node = Book(), 7, "n2"
    work = node.current()[1]
    (work / ".steps").mkdir()
    (work / ".steps" / "1.rc").write_text("0")  # the step already ended: the follow returns at once
    if superseded:
        with pytest.raises(Superseded):
            node.run_step(["pegasus", "quantize"], work, 60, lambda chunk: None)
        assert not (work / ".steps" / "1.req").exists()
        return
    assert node.run_step(["pegasus", "quantize"], work, 60, lambda chunk: None) == 0
    assert recorded == [(1, "slurm job 7 on n2", False)]  # recorded while no request was on the share
    assert (work / ".steps" / "1.req").exists()


@pytest.mark.parametrize("state, restarts, cancel, code", [
    ("PENDING", 1, None, "ENGINE_LOST"),  # `scontrol requeue`, preemption: the cluster job serves attempt 2 now
    ("CANCELLED", 0, None, "ENGINE_LOST"),  # an operator's scancel, the time limit
    ("RUNNING", 0, None, None),  # the step's own signal (its timeout's kill, the OOM killer): its code stands
    ("CANCELLED", 0, "cancel", "CANCELLED"),  # `saigeedged cancel`'s scancel
])
def test_a_step_killed_by_its_agent_is_lost_to_slurm_unless_the_daemon_cancelled(
        tmp_path: Path, state: str, restarts: int, cancel: str | None, code: str | None) -> None:
    """A node step ends 143 because its agent got Slurm's TERM (and wrote the stop file, as it does on any TERM):
    the attempt is lost to Slurm (ENGINE_LOST, retried), not cancelled by a file on the share; CANCELLED only when the
    daemon itself cancelled; the step's own failure when Slurm still runs the attempt."""
    cluster_job = {"job_id": 7, "name": "det-1", "job_state": state, "restart_cnt": restarts, "comment": "attempt=1"}
    node = _node(tmp_path, _job(), [cluster_job], [])
    node.interrupted = lambda: cancel
    work = node.current()[1]
    (work / ".steps").mkdir()
    (work / ".steps" / "1.rc").write_text("143")
    (work / ".step.stop").write_text("cancel")  # what the agent's kill writes on any TERM
    if code is None:
        assert node.run_step(["pegasus", "quantize"], work, 60, lambda chunk: None) == 143
        return
    with pytest.raises(SaigeError) as raised:
        node.run_step(["pegasus", "quantize"], work, 60, lambda chunk: None)
    assert raised.value.code == code


def _failing_python(tmp_path: Path) -> Path:
    """A node's interpreter failing as an agent that cannot write on the share would: a traceback, exit 1."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'Traceback (most recent call last):'\n"
                      "echo \"PermissionError: [Errno 13] Permission denied: '$5'\" >&2\nexit 1\n")
    python.chmod(0o755)
    return python


def test_an_agent_that_dies_before_it_is_ready_is_heard(tmp_path: Path) -> None:
    """The batch script (run here by sh, as slurmd runs it) sends its agent's output beside the attempt's folder,
    named by the attempt it serves (a requeue's too); a cluster job that ended before its agent was ready fails the
    attempt with the agent's last words and its node. Slurm's --output=/dev/null threw the traceback away: the message
    said only that the cluster job had ended, and an operator had nothing to look at. On a node without the share
    the script cannot even open its log: said so. Its node is left out for the target while another serves it, never
    when it is the last one or a name sinfo does not know."""
    import json
    import subprocess

    from saigeedged.adapters.slurm.agent import agent_log
    from saigeedged.adapters.slurm.node import NodeContainer

    python = _failing_python(tmp_path)
    restarts, known, img = [0], [], feature("npu:1")
    node_dir = [tmp_path / "work"]  # where the node sees the share (gone: not mounted there)

    def run(argv: Any, stdin: str | None) -> str:
        if argv[0] == "sbatch":  # a node runs the script after Slurm requeued it restarts[0] times
            assert stdin is not None
            script = stdin.replace(str(tmp_path / "work"), str(node_dir[0]))
            subprocess.run(["sh", "-c", script], env={"SLURM_RESTART_COUNT": str(restarts[0]), "PATH": "/usr/bin:/bin"},
                           check=False, capture_output=True)
            return "7"
        if argv[0] == "sinfo":
            return json.dumps({"nodes": [{"name": n, "state": "idle", "gres": "cubie:1", "active_features": f"cubie,{img}",
                                          "partitions": ["saige"]} for n in known]})
        return json.dumps({"jobs": [{"job_id": 7, "name": "det-1", "job_state": "FAILED", "comment": "attempt=1",
                                     "restart_cnt": restarts[0], "batch_host": "cn03"}]})

    config = configmod.load(write_config(tmp_path, executor={"kind": "slurm", "partition": "saige",
                                                             "work_share": str(tmp_path / "work")},
                                         cubie={"image": "npu:1"}))
    job = _job()
    job_dir = tmp_path / "work" / "det-1 it's"  # quoted in the script
    (job_dir / "attempt1").mkdir(parents=True)
    node = NodeContainer(config, cluster.Slurm(config.executor, run), "cubie", lambda: (job, job_dir / "attempt1"),
                         lambda: None, python=str(python), ready_grace_s=0.1)  # no ready file is coming
    said = f"PermissionError: [Errno 13] Permission denied: '{job_dir}'"
    agent_log(job_dir, 1).write_text("an earlier cluster job's words\n")  # not this one's: removed at sbatch
    with pytest.raises(SaigeError) as caught:
        node.ensure()
    assert agent_log(job_dir, 1).read_text().splitlines() == ["Traceback (most recent call last):", said]
    assert caught.value.code == "ENGINE_LOST" and caught.value.message == \
        f"cluster job 7 ended on node cn03 before its node was ready (FAILED); its agent said: {said}"
    assert list(node.slurm.left_out.avoided()) == []  # the node is Slurm's cn03 only when sinfo knows it by that name
    node.end_job(job_dir / "attempt1")  # the attempt's end removes what it said (the job's folder can go then)
    assert not agent_log(job_dir, 1).exists()
    known.append("cn03")  # the last node that serves the target: never left out on a guess (the cause may be all's)
    with pytest.raises(SaigeError) as caught:
        node.ensure()
    assert caught.value.code == "ENGINE_LOST" and list(node.slurm.left_out.avoided()) == []
    known.append("cn04")
    with pytest.raises(SaigeError) as caught:  # a node that fails its agents is left out for the target while another
        node.ensure()  # serves it; the attempt is spent all the same
    assert caught.value.code == "ENGINE_LOST" and caught.value.message.startswith(
        f"cluster job 7 ended on node cn03 before its node was ready (FAILED); its agent said: {said}")
    assert list(node.slurm.left_out.avoided("cubie")) == ["cn03"] and node.slurm.left_out.avoided("mobilint") == {}
    restarts[0] = 1  # requeued once: the script serves (and logs for) attempt 2
    with pytest.raises(SaigeError):
        node.ensure()
    assert agent_log(job_dir, 2).read_text().splitlines()[-1] == said
    restarts[0], node_dir[0] = 0, tmp_path / "unmounted"
    with pytest.raises(SaigeError) as caught:
        node.ensure()
    assert f"no agent log (attempt1.agent.log is missing; looked for {agent_log(job_dir, 1)}): the node may not " \
        "reach the share" in caught.value.message


def _sinfo(names: list[str], image: str = "npu:1") -> str:
    """sinfo --json of idle nodes that serve both targets with `image`."""
    import json

    return json.dumps({"nodes": [{"name": n, "state": "idle", "gres": "cubie:1,mobilint:1", "partitions": ["saige"],
                                  "active_features": f"cubie,mobilint,{feature(image)}"} for n in names]})


def _slurm_config(tmp_path: Path) -> Any:
    return configmod.load(write_config(tmp_path, executor={"kind": "slurm", "partition": "saige",
                                                           "work_share": str(tmp_path / "work")},
                                       cubie={"image": "npu:1"}, mobilint={"image": "npu:1"}))


@pytest.mark.timeout(30)  # a retake waiting on the failed agent's cluster job (squeue says RUNNING) never ends
@pytest.mark.parametrize("nodes, code", [(["cn07", "cn08"], "DOCKER_UNAVAILABLE"), (["cn07"], "IMAGE_NOT_FOUND")])
def test_a_node_that_lacks_the_image_is_left_out_and_the_job_requeued_while_another_serves(
        tmp_path: Path, nodes: list[str], code: str) -> None:
    """A node whose feature names the image but whose engine lacks it failed every job Slurm placed there in seconds
    (IMAGE_NOT_FOUND, not retried), and a node that fails fast is the first one free again. Now that node is left out
    of the target's next cluster jobs (sbatch --exclude) and room for AVOID_S (even the only one), then taken back;
    while another node serves the target the job goes back to the queue unspent (DOCKER_UNAVAILABLE), else the agent's
    error stands. The retake submits a new cluster job at once: the failed agent's one, which squeue may still show
    RUNNING as it ends, is retired (cancelled, never taken for the attempt's own)."""
    import json

    from saigeedged.adapters.slurm.agent import ready_path
    from saigeedged.adapters.slurm.leftout import AVOID_S, LeftOut
    from saigeedged.adapters.slurm.node import NodeContainer
    from saigeedged.cli.partition import node_line

    now = [0.0]
    sbatch: list[list[str]] = []
    cancelled: list[str] = []
    jobs: list[dict[str, Any]] = []
    missing = SaigeError("IMAGE_NOT_FOUND", "image npu:1 is not loaded").as_dict(None)

    def run(argv: Any, stdin: str | None) -> str:
        if argv[0] == "sbatch":  # the node Slurm picks first runs the agent, which writes its ready file at once
            sbatch.append(list(argv))
            excluded = next((a.split("=")[1].split(",") for a in argv if a.startswith("--exclude=")), [])
            host = next(n for n in nodes if n not in excluded)
            cid = 7 + len(jobs)
            jobs.append({"job_id": cid, "name": "det-1", "job_state": "RUNNING", "restart_cnt": 0,
                         "comment": "attempt=1", "batch_host": host})
            said = {"error": missing, "cluster_id": cid} if host == "cn07" else {"image_id": "sha256:1"}
            ready_path(work.parent, 1).write_text(json.dumps({**said, "node": f"{host}.example.org"}))
            return str(cid)
        if argv[0] == "scancel":
            cancelled.append(argv[1])
            return ""
        return _sinfo(nodes) if argv[0] == "sinfo" else json.dumps({"jobs": jobs})

    config = _slurm_config(tmp_path)
    kept = tmp_path / "slurm-left-out.json"
    slurm = cluster.Slurm(config.executor, run, left_out=LeftOut(clock=lambda: now[0], kept=kept))
    job = _job()
    work = tmp_path / "work" / "det-1" / "attempt1"
    work.mkdir(parents=True)
    node = NodeContainer(config, slurm, "cubie", lambda: (job, work), lambda: None)
    with structlog.testing.capture_logs() as logs, pytest.raises(SaigeError) as caught:
        node.ensure()
    assert caught.value.code == code
    # the agent's hostname need not be Slurm's node name: the cluster job's batch_host is (sbatch refuses others)
    assert caught.value.message.startswith("on node cn07.example.org: image npu:1 is not loaded")
    assert ("back to the queue for another node (cn07 is left out of this daemon's cubie target's jobs for 10 min)"
            in caught.value.message) == (len(nodes) > 1)
    assert not ready_path(work.parent, 1).exists() and cancelled == ["7"]  # its word taken, its cluster job retired
    [left] = [e for e in logs if e["event"] == "job.node_left_out"]
    assert (left["node"], left["target"], left["error_code"], left["other_nodes"]) \
        == ("cn07", "cubie", "IMAGE_NOT_FOUND", len(nodes) - 1)
    assert list(slurm.left_out.avoided("cubie")) == ["cn07"] and [n.name for n in slurm.usable("cubie")] == nodes[1:]
    assert slurm.left_out.avoided("mobilint") == {} and len(slurm.usable("mobilint")) == len(nodes)  # its image is there
    assert not [a for a in sbatch[0] if a.startswith("--exclude")]
    if len(nodes) > 1:  # the retake (same attempt, unspent): a new cluster job elsewhere, job 7 still "RUNNING"
        node.ensure()
        assert "--exclude=cn07" in sbatch[-1] and (node.node, node.cluster_id) == ("cn08.example.org", 8)
    slurm.submit("det-2", "mobilint", "npu:1", 1, "#!/bin/sh\n", 60)
    assert not [a for a in sbatch[-1] if a.startswith("--exclude")]
    # kept for a restart and for check and status (other processes), which name what and why
    assert LeftOut(clock=lambda: now[0], kept=kept).avoided("cubie") == {"cn07": caught.value.message.split(";")[0]}
    [line] = [node_line(n, {"cubie": "npu:1", "mobilint": "npu:1"}, slurm.left_out.listed())
              for n in slurm.nodes() if n.name == "cn07"]
    assert line.endswith("; left out of cubie target's jobs by the daemon until "
                         f"{time.strftime('%H:%M:%S', time.localtime(AVOID_S))}: on node cn07.example.org: image npu:1 "
                         "is not loaded"), line
    slurm.left_out.avoid("cn99", "a dynamic node that has left since")  # sbatch refuses a name it does not know
    slurm.left_out.avoid("cn08", "its engine does not answer")  # every target's
    slurm.submit("det-2", "mobilint", "npu:1", 1, "#!/bin/sh\n", 60)
    assert [a for a in sbatch[-1] if a.startswith("--exclude")] == (["--exclude=cn08"] if len(nodes) > 1 else [])
    now[0] += AVOID_S
    with structlog.testing.capture_logs() as logs:
        assert slurm.left_out.avoided() == {}
    assert sorted(e["node"] for e in logs if e["event"] == "slurm.node_taken_back") == ["cn07", "cn08", "cn99"]
    assert LeftOut(clock=lambda: now[0] - AVOID_S, kept=kept).avoided() == {}  # taken back in the file too
    slurm.submit("det-3", "cubie", "npu:1", 1, "#!/bin/sh\n", 60)
    assert not [a for a in sbatch[-1] if a.startswith("--exclude")]


def test_a_ready_file_the_share_shows_late_is_read(tmp_path: Path) -> None:
    """squeue says the cluster job failed before the agent's ready file shows on the share (NFS, actimeo=1): it is
    looked for a while more, and its word read (the node left out, the job back to the queue), not an ENGINE_LOST
    "ended before its node was ready" that left the node in."""
    import json
    import threading

    from saigeedged.adapters.slurm.agent import ready_path
    from saigeedged.adapters.slurm.node import NodeContainer

    missing = SaigeError("IMAGE_NOT_FOUND", "image npu:1 is not loaded").as_dict(None)

    def run(argv: Any, stdin: str | None) -> str:
        if argv[0] == "sbatch":
            threading.Timer(0.3, lambda: ready_path(work.parent, 1).write_text(json.dumps(
                {"error": missing, "node": "cn07", "slurm_node": "cn07", "cluster_id": 7}))).start()
            return "7"
        return _sinfo(["cn07", "cn08"]) if argv[0] == "sinfo" else json.dumps({"jobs": [
            {"job_id": 7, "name": "det-1", "job_state": "FAILED", "restart_cnt": 0, "comment": "attempt=1",
             "batch_host": "cn07"}]})

    config = _slurm_config(tmp_path)
    job = _job()
    work = tmp_path / "work" / "det-1" / "attempt1"
    work.mkdir(parents=True)
    node = NodeContainer(config, cluster.Slurm(config.executor, run), "cubie", lambda: (job, work), lambda: None)
    with pytest.raises(SaigeError) as caught:
        node.ensure()
    assert (caught.value.code, caught.value.message.split(";")[0]) \
        == ("DOCKER_UNAVAILABLE", "on node cn07: image npu:1 is not loaded")
    assert list(node.slurm.left_out.avoided("cubie")) == ["cn07"]


def test_a_ready_agent_closes_and_removes_its_log(tmp_path: Path) -> None:
    """Once ready the agent's output goes nowhere (as Slurm's --output) and its log is gone: its open log kept the job's
    folder from being removed at the job's end (on NFS a file removed while open lingers as .nfsXXXX until closed)."""
    import subprocess
    import sys

    from saigeedged.adapters.slurm.agent import agent_log

    log = agent_log(tmp_path, 1)
    probe = ("import os, sys; from pathlib import Path; from saigeedged.adapters.slurm.agent import _quiet\n"
             "print('starting', flush=True); _quiet(Path(sys.argv[1]))\n"
             "Path(sys.argv[2]).write_text(os.readlink('/proc/self/fd/1') + ' ' + os.readlink('/proc/self/fd/2'))\n"
             "print('after ready, to nowhere'); print('and stderr', file=sys.stderr)\n")
    with log.open("ab") as out:
        ran = subprocess.run([sys.executable, "-c", probe, str(log), str(tmp_path / "fds")], stdout=out, stderr=out,
                             check=False)
    assert ran.returncode == 0 and not log.exists()
    assert (tmp_path / "fds").read_text() == "/dev/null /dev/null"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fds"]

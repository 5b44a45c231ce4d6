"""Detached container steps (SPEC §15) against a real engine and the stand-in image: a step belongs to its attempt's
work dir, so a second daemon (a new Containers on the same state dir) finds it by number, re-attaches to it while it
runs, or reads the exit code of one that ended, and never runs it again."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from engineproxy import EngineProxy
from harness import container_output, wait_for

from saigeedged import config as configmod
from saigeedged.adapters.docker import Containers, detached, execs
from saigeedged.errors import SaigeError

pytestmark = pytest.mark.docker


def _count(container: Containers, target: str, marker: str) -> int:
    ctr = container.api().containers.get(container.container(target).spec.name)
    return container_output(ctr, ["ps", "-o", "args"]).count(marker)


class Followed:
    """A step a new Containers started in `work`, followed in a thread (what it raised kept), once it printed `started`."""

    def __init__(self, docker_config: Path, work: str, argv: list[str]) -> None:
        config = configmod.load(docker_config)
        self.work = config.work_root / work
        self.work.mkdir(parents=True)
        self.containers = Containers(config)
        self.ctr = self.containers.get("cubie")
        self.errors: list[SaigeError] = []
        self.thread = threading.Thread(target=self._run, args=(argv,))
        self.thread.start()
        wait_for(lambda: b"started" in _read(self.work / ".steps" / "1.log"), 30, "the step started")

    def _run(self, argv: list[str]) -> None:
        try:
            self.ctr.run_step(argv, self.work, 600, lambda chunk: None)
        except SaigeError as exc:
            self.errors.append(exc)

    def ended(self) -> list[SaigeError]:
        """What it raised, once its thread ended (AssertionError if it did not within a minute)."""
        self.thread.join(60)
        self.containers.release()
        assert not self.thread.is_alive(), "the step's follow did not end"
        return self.errors


def test_a_second_daemon_reattaches_to_a_running_step_and_gets_only_new_output(docker_config: Path) -> None:
    """A step left running by a stop is followed by the next daemon: the same process (not a second one), the output
    the job log already had goes to `replay` only, the rest to the sink, and its exit code is the step's."""
    config = configmod.load(docker_config)
    first = Containers(config)
    work = config.work_root / "job-reattach"
    work.mkdir(parents=True)
    gate = work / "go"
    script = f"echo run >> starts.txt; echo before; while [ ! -e {gate} ]; do sleep 0.1; done; echo after; exit 7"
    stopping = threading.Event()
    seen: list[bytes] = []
    errors: list[SaigeError] = []

    def run_first() -> None:
        try:
            first.get("cubie").run_step(["sh", "-c", script], work, 60, seen.append, stopping=stopping.is_set)
        except SaigeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_first)
    thread.start()
    wait_for(lambda: b"before" in b"".join(seen), 30, "the first daemon's output")
    stopping.set()
    thread.join(30)
    assert errors and errors[0].code == "CANCELLED" and errors[0].fields.get("detached")
    first.release()
    assert _count(first, "cubie", f"while [ ! -e {gate} ]") >= 1  # the stop left it running

    second = Containers(config)  # a new daemon: nothing in memory, the work dir on disk
    replayed: list[bytes] = []
    fresh: list[bytes] = []
    gate.touch()
    code = second.get("cubie").run_step(["sh", "-c", script], work, 60, fresh.append, replay=replayed.append)
    second.release()
    assert code == 7
    assert b"before" in b"".join(replayed) and b"before" not in b"".join(fresh)
    assert b"after" in b"".join(fresh)
    assert (work / "starts.txt").read_text() == "run\n"  # followed, never started a second time


def test_a_step_that_ended_unseen_gives_its_code_without_running_again(docker_config: Path) -> None:
    """Steps 1 and 2 of an attempt ran while no daemon followed step 2: a new daemon replaying the attempt gets both
    exit codes from their files, and neither command runs a second time."""
    config = configmod.load(docker_config)
    work = config.work_root / "job-ended"
    work.mkdir(parents=True)
    first = Containers(config)
    ctr = first.get("cubie")
    assert ctr.run_step(["sh", "-c", "echo one >> runs.txt"], work, 60, lambda chunk: None) == 0
    stopping = threading.Event()
    stopping.set()  # the daemon stops as soon as step 2 has started
    two = f"echo two >> runs.txt; while [ ! -e {work / 'go'} ]; do sleep 0.1; done; exit 3"
    with pytest.raises(SaigeError) as stopped:
        ctr.run_step(["sh", "-c", two], work, 60, lambda chunk: None, stopping=stopping.is_set)
    assert stopped.value.fields.get("reason") == "stop"
    first.release()
    (work / "go").touch()
    wait_for(lambda: (work / ".steps" / "2.rc").exists(), 30, "step 2 ending on its own")

    again = Containers(config).get("cubie")
    assert again.run_step(["sh", "-c", "echo one >> runs.txt"], work, 60, lambda chunk: None) == 0
    assert again.run_step(["sh", "-c", two], work, 60, lambda chunk: None) == 3
    assert (work / "runs.txt").read_text() == "one\ntwo\n"


class KilledHere(Exception):
    """The daemon dies at this point (a watchdog's SIGABRT of a frozen daemon, a SIGKILL)."""


class DiesBeforeTheStart(detached.FileBook):
    """A book whose daemon dies once the step's exec is recorded, before the engine is asked to start it."""

    def launched(self, work: Path, n: int, exec_id: str) -> None:
        super().launched(work, n, exec_id)
        raise KilledHere


def _unstarted(config: configmod.Config, name: str, step: list[str]) -> Path:
    """The work dir of an attempt whose daemon died between its first step's exec create and its start."""
    work = config.work_root / name
    work.mkdir(parents=True)
    first = Containers(config)
    ctr = first.get("cubie")
    ctr.book = DiesBeforeTheStart()
    with pytest.raises(KilledHere):
        ctr.run_step(step, work, 60, lambda chunk: None)
    first.release()
    assert (work / ".steps" / "1.exec").is_file() and not (work / "runs.txt").exists()
    return work


UNSTARTED = ["sh", "-c", "echo run >> runs.txt; exit 5"]


def test_a_step_created_but_never_started_is_started_by_the_next_daemon(docker_config: Path) -> None:
    """A daemon killed between its exec's create and its start: the next daemon finds the exec never started, starts it
    and gets its code; the step ran once and its attempt is not lost (CONTAINER_LOST before)."""
    config = configmod.load(docker_config)
    work = _unstarted(config, "job-unstarted", UNSTARTED)
    assert Containers(config).get("cubie").run_step(UNSTARTED, work, 60, lambda chunk: None) == 5
    assert (work / "runs.txt").read_text() == "run\n"


def test_a_never_started_step_of_a_cancelled_job_is_not_started(docker_config: Path) -> None:
    """The same, but the job was cancelled while no daemon ran: the re-attach ends CANCELLED and the step never runs."""
    config = configmod.load(docker_config)
    work = _unstarted(config, "job-unstarted-cancelled", UNSTARTED)
    ctr = Containers(config).get("cubie")
    ctr.interrupted = lambda: "cancel"
    with pytest.raises(SaigeError) as ended:
        ctr.run_step(UNSTARTED, work, 60, lambda chunk: None)
    assert ended.value.code == "CANCELLED" and not (work / "runs.txt").exists()


def test_a_step_whose_container_was_recreated_is_lost(docker_config: Path, docker_client: Any) -> None:
    """The container is removed under a running step (recreated, engine rebooted): following it ends CONTAINER_LOST
    (retryable), never a hang."""
    step = Followed(docker_config, "job-gone", ["sh", "-c", "echo started; sleep 300"])
    docker_client.containers.get(step.ctr.spec.name).remove(force=True)
    errors = step.ended()
    assert [e.code for e in errors] == ["CONTAINER_LOST"] and errors[0].retryable


def test_a_step_killed_while_the_engine_is_gone_is_not_taken_for_a_lost_container(
        docker_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step ends by a signal (137) just as the engine goes away: whether its container died cannot be asked, so the
    attempt waits for its engine (DOCKER_UNAVAILABLE), not CONTAINER_LOST (a retry in a new container, an attempt
    spent, the container removed); once the engine answers, the step's own exit code is the answer."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    monkeypatch.setenv("DOCKER_HOST", proxy.docker_host)
    monkeypatch.setattr(execs, "LOST_GRACE_S", 120)  # the look at the container is under way when the engine goes
    gate = configmod.load(docker_config).work_root / "job-signal" / "go"  # seen by the container at the same path
    step = ["sh", "-c", f"echo started; while [ ! -e {gate} ]; do sleep 0.1; done; kill -KILL $$"]
    followed = Followed(docker_config, "job-signal", step)
    gate.touch()
    wait_for(lambda: (followed.work / ".steps" / "1.rc").exists(), 30, "the step killed")
    proxy.down()
    assert [e.code for e in followed.ended()] == ["DOCKER_UNAVAILABLE"], followed.errors

    monkeypatch.undo()  # the engine is back (its own socket, the grace as it was): the next daemon re-attaches and
    again = Containers(configmod.load(docker_config))  # reads the step's own code
    assert again.get("cubie").run_step(step, followed.work, 60, lambda chunk: None) == 137
    again.release()


def test_a_cancelled_step_ends_the_job_without_a_look_at_its_container(docker_config: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel kills the job's running step (by a signal): CANCELLED as soon as the step's exit code is there, not
    after the wait a step killed by a signal otherwise gets to see whether its whole container is going down (2 s;
    120 s here, which the join would not outlast)."""
    monkeypatch.setattr(execs, "LOST_GRACE_S", 120)
    step = Followed(docker_config, "job-cancelled", ["sh", "-c", "echo started; sleep 300"])
    step.ctr.interrupted = lambda: "cancel"  # the worker's word, then its kill (what `saigeedged cancel` makes it do)
    step.ctr.interrupt(step.work, "cancel")
    assert [(e.code, e.fields.get("reason")) for e in step.ended()] == [("CANCELLED", "cancel")]
    assert int((step.work / ".steps" / "1.rc").read_text()) >= 128  # killed by the cancel, not ended on its own


def test_recreate_on_an_engine_that_is_gone_returns_and_says_so(docker_config: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The container died under a job and the engine went with it: the requeue's recreate does not raise (the next
    ensure() starts or makes the container), it leaves a warning naming the container."""
    proxy = EngineProxy(tmp_path / "engine.sock")
    proxy.up()
    monkeypatch.setenv("DOCKER_HOST", proxy.docker_host)
    events: list[tuple[str, dict[str, Any]]] = []
    containers = Containers(configmod.load(docker_config), on_event=lambda name, fields: events.append((name, fields)))
    name = containers.get("cubie").spec.name
    containers.release()
    proxy.down()
    containers.container("cubie").recreate()
    assert [(e, f["container"], f["error_code"]) for e, f in events if e == "container.recreate_failed"] == \
        [("container.recreate_failed", name, "DOCKER_UNAVAILABLE")]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


@pytest.mark.parametrize("planted", ["stop", "cancel"])
def test_a_stop_file_a_step_planted_neither_cancels_nor_detaches_the_job(docker_config: Path, planted: str) -> None:
    """The stop file is for the steps' wrapper only: one a step wrote into another job's folder keeps that job's next
    step from running (it fails, exit 143) but does not end the job CANCELLED, nor detach it as a daemon stop would
    (for ever: at every start); a cancel is the worker's own word."""
    config = configmod.load(docker_config)
    work = config.work_root / "job-planted"
    work.mkdir(parents=True)
    (work / execs.STOPFILE).write_text(planted)
    containers = Containers(config)
    ctr = containers.get("cubie")
    assert ctr.run_step(["sh", "-c", "echo ran > ran.txt"], work, 60, lambda chunk: None) == 143
    assert not (work / "ran.txt").exists()
    containers.interrupted = lambda: "cancel"  # the worker was told to cancel: its next step raises before it starts
    containers.release()
    with pytest.raises(SaigeError) as raised:
        containers.get("cubie").run_step(["sh", "-c", "echo ran > ran.txt"], work, 60, lambda chunk: None)
    containers.release()
    assert raised.value.code == "CANCELLED" and raised.value.fields.get("reason") == "cancel"

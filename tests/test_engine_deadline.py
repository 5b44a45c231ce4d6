"""Every engine call has a deadline (SPEC §15, issue 26 item 1): a dockerd that sends the headers of an `exec start`
and then nothing does not hold a reap, a kill or the engine monitor for ever."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import write_config
from harness import wait_for
from stalldocker import StallingDocker, container_doc

from saigeedged import config as configmod
from saigeedged.adapters.docker import Engine
from saigeedged.adapters.store import Store
from saigeedged.errors import SaigeError
from saigeedged.jobs import Attempt, Job
from saigeedged.service.monitor import STUCK_FACTOR, EngineMonitor

TIMEOUT_S = 1.0  # limits.engine_timeout_s of these tests
CALL_S = 8.0  # the deadline of the one test that looks at a call while it is under way
GIVE_UP_S = 60.0  # how long a test waits for a call that must end: far past its deadline, short of "for ever"


@pytest.fixture
def stalling(tmp_path: Path) -> Iterator[tuple[StallingDocker, configmod.Config]]:
    work_root = tmp_path / "state" / "work"
    work_root.mkdir(parents=True)
    # a short path (a socket's is at most 107 bytes) unique across xdist workers: their tmp_path names repeat
    fake = StallingDocker(Path(f"/tmp/w-stall-{uuid.uuid4().hex[:16]}.sock"), container_doc("saige-cubie", work_root))
    path = write_config(tmp_path, engines=[{"name": "stall", "url": fake.url, "targets": ["cubie"]}],
                        limits={"engine_timeout_s": TIMEOUT_S})
    yield fake, configmod.load(path)
    fake.release()
    fake.path.unlink(missing_ok=True)


def _ends(call: Callable[[], Any]) -> tuple[bool, BaseException | None]:
    """Run `call` on a thread: (did it return or raise before GIVE_UP_S, what it raised)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GIVE_UP_S)
    return not thread.is_alive(), raised[0] if raised else None


def _reap_pending(config: configmod.Config, tmp_path: Path) -> tuple[EngineMonitor, Path]:
    """A monitor of the fake engine with the reap of one given-up attempt pending (its work dir)."""
    engine = Engine(config.engines[0], config)
    store = Store(tmp_path / "state" / "saigeedged.db")
    monitor = EngineMonitor([engine], store, lambda name, reason: None, lambda: None, lambda: 0.0, TIMEOUT_S)
    work = config.work_root / "job-1" / "attempt1"
    store.add(Job(job_id="job-1", name="job", target="cubie", task="mlc", entry={"onnx": "/x.onnx"}, subdir="",
                  claim_dir="/c/job-1", manifest="x.yml", created_at="t"))
    taken = store.take("job-1", "stall", "2026-12-01T00:00:00Z", str(work))
    assert taken is not None
    monitor.abandoned([Attempt.of(taken)])
    return monitor, work


def test_reap_on_a_stalled_stream_ends_with_docker_unavailable(stalling: tuple[StallingDocker, configmod.Config]) -> None:
    """A reap whose exec stream stalls after its headers ends within the engine timeout as DOCKER_UNAVAILABLE."""
    fake, config = stalling
    container = Engine(config.engines[0], config).container("cubie")
    ended, raised = _ends(lambda: container.reap([config.work_root / "job-1" / "attempt1"]))
    assert fake.stalled.is_set(), "the fake never stalled: the test did not reach the stream"
    assert ended, "the reap is still blocked on a stream the engine stopped sending"
    assert isinstance(raised, SaigeError) and raised.code == "DOCKER_UNAVAILABLE", raised
    assert "killing leftover steps" in raised.message


def test_cancel_kill_on_a_stalled_stream_returns(stalling: tuple[StallingDocker, configmod.Config]) -> None:
    """A cancel's kill of a step on a hung engine returns (the cancel is not left hanging in a thread for ever)."""
    fake, config = stalling
    container = Engine(config.engines[0], config).container("cubie")
    work = config.work_root / "job-1" / "attempt1"
    work.mkdir(parents=True)
    ended, raised = _ends(lambda: container.interrupt(work, "cancel"))
    assert fake.stalled.is_set()
    assert ended and raised is None


def test_monitor_tick_with_a_reap_pending_is_not_frozen(stalling: tuple[StallingDocker, configmod.Config],
                                                         tmp_path: Path) -> None:
    """The engine monitor's bring-up reap on a hung engine gives up within the timeout and keeps the reap pending."""
    fake, config = stalling
    monitor, work = _reap_pending(config, tmp_path)
    ended, raised = _ends(lambda: monitor.tick("stall"))
    assert ended, "the monitor's thread is frozen in the reap"
    assert isinstance(raised, SaigeError) and raised.code == "DOCKER_UNAVAILABLE"
    assert monitor.pending() == [work], "the reap must be tried again when the engine answers"
    assert not monitor.health["stall"].up


def test_a_call_under_way_past_the_timeout_makes_the_engine_slow_and_then_stuck(
        stalling: tuple[StallingDocker, configmod.Config], tmp_path: Path) -> None:
    """A call to an engine that answers pings but not that call takes the engine out of service past engine_timeout_s
    (STATUS= names it) and, far past every bound, makes the daemon unhealthy (no watchdog ping)."""
    fake, _ = stalling
    # the client waits CALL_S (the test's looks at the call under way must come before its end, on a loaded machine
    # too); the monitor below judges on far less
    config = configmod.load(write_config(tmp_path, engines=[{"name": "stall", "url": fake.url, "targets": ["cubie"]}],
                                         limits={"engine_timeout_s": CALL_S}))
    engine = Engine(config.engines[0], config)
    monitor = EngineMonitor([engine], Store(tmp_path / "state" / "saigeedged.db"), lambda name, reason: None,
                            lambda: None, lambda: 0.0, TIMEOUT_S / 50)
    container = engine.container("cubie")
    ended: list[bool] = []
    threading.Thread(target=lambda: ended.append(_ends(lambda: container.reap([tmp_path / "w"]))[0]),
                     daemon=True).start()
    assert fake.stalled.wait(GIVE_UP_S)
    wait_for(lambda: engine.busy_s() > monitor.timeout_s * STUCK_FACTOR, GIVE_UP_S, "a call under way that long")
    monitor.tick("stall")
    assert monitor.health["stall"].slow and not monitor.ready("stall", "cubie")
    assert monitor.unreachable() == ["stall"]
    assert monitor.stuck() == ["stall"]
    wait_for(lambda: ended, GIVE_UP_S, "the stalled call to end at its own deadline")
    monitor.tick("stall")
    assert monitor.stuck() == [] and not monitor.health["stall"].slow


@pytest.mark.parametrize(("status", "words", "code"), [
    (409, "Container c0ffee is not running", "CONTAINER_LOST"),
    (404, "No such container: c0ffee", "CONTAINER_LOST"),
    (500, "OCI runtime exec failed: unable to start container process", "CONTAINER_FAILED"),
    (500, "OCI runtime exec failed: exec failed: unable to start container process: error writing config to pipe: "
          "write init-p: broken pipe: unknown", "CONTAINER_LOST"),  # restarted as the exec started (it was FAILED)
    (500, "OCI runtime exec failed: exec failed: cannot exec in a stopped container: unknown", "CONTAINER_LOST"),
])
def test_an_exec_the_engine_refuses_ends_the_step_with_its_code_and_words(
        stalling: tuple[StallingDocker, configmod.Config], status: int, words: str, code: str) -> None:
    """The engine answers a step's `exec create` with an error (the container stopped since it was found running; the
    runtime failing): the step ends with a stable code and the engine's own words, not a traceback (INTERNAL); a
    container that stopped meanwhile is CONTAINER_LOST (retried in a fresh one)."""
    fake, config = stalling
    fake.refuse_exec = (status, words)
    container = Engine(config.engines[0], config).container("cubie")
    work = config.work_root / "job-1" / "attempt1"
    work.mkdir(parents=True)
    with pytest.raises(SaigeError) as raised:
        container.run_step(["pegasus", "quantize"], work, 60, lambda chunk: None)
    assert (raised.value.code, raised.value.retryable) == (code, code == "CONTAINER_LOST")
    assert words in raised.value.message and "starting pegasus quantize" in raised.value.message
    assert container.calls == 0  # the refused call is not left counted as under way


@pytest.mark.parametrize(("status", "words", "kept"), [
    (500, "OCI runtime exec failed", True),
    (409, "Container c0ffee is not running", False),
])
def test_a_reap_the_engine_refuses_is_kept_unless_the_container_is_not_running(
        stalling: tuple[StallingDocker, configmod.Config], tmp_path: Path, status: int, words: str,
        kept: bool) -> None:
    """The bring-up reap's exec refused: by the runtime (a 5xx), the step may still run, so the reap stays pending and
    the engine takes no work until it is done; because the container is not running, its steps are dead with it, so
    the reap is done and the engine comes up."""
    fake, config = stalling
    fake.refuse_exec = (status, words)
    monitor, work = _reap_pending(config, tmp_path)
    if kept:
        with pytest.raises(SaigeError) as raised:
            monitor.tick("stall")
        assert raised.value.code == "CONTAINER_FAILED" and words in raised.value.message
    else:
        monitor.tick("stall")
    assert (monitor.pending() == [work]) is kept and monitor.health["stall"].up is not kept

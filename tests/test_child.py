"""In-process compiler work in a child process: results, errors, stop/cancel and timeouts end it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import write_config

from saigeedged import config as configmod
from saigeedged.adapters.joblog import JobLog
from saigeedged.compile import child, report
from saigeedged.compile.backends import Context
from saigeedged.errors import SaigeError


def pid_then_sleep(path: str, seconds: float) -> None:
    with open(path, "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(seconds)


def pid_then_hold(path: str, seconds: float) -> None:
    """The pid, then C code that holds the GIL for hours (no thread of the child runs meanwhile; `seconds` unused)."""
    with open(path, "w") as fh:
        fh.write(str(os.getpid()))
    sum(range(10**13))


def fail() -> None:
    raise ValueError("boom in the child")


def blas_threads() -> int:
    """The thread count numpy's OpenBLAS runs with in this process (its own C call, as threadpoolctl reads it)."""
    import ctypes

    import numpy  # noqa: F401  (maps its OpenBLAS, already loaded in a child)

    with open("/proc/self/maps") as fh:
        path = next(line.split()[-1] for line in fh if "openblas" in line.rsplit("/", 1)[-1])
    lib = ctypes.CDLL(path)
    names = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")
    return int(next(getattr(lib, n) for n in names if hasattr(lib, n))())


def idle_report(seconds: float) -> dict[str, Any]:
    """A report child that waits without working, as one starved by the compiles beside it does."""
    time.sleep(seconds)
    return {"notes": [], "idled": seconds}


def busy_report(pidfile: str) -> None:
    """A report child that works and never ends."""
    with open(pidfile, "w") as fh:
        fh.write(str(os.getpid()))
    while True:
        pass


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_result_and_exception_come_back() -> None:
    """The child's return value, and its exception re-raised in the parent."""
    assert child.run(sum, ([1, 2, 3],), "sum", 30, lambda: None) == 6
    with pytest.raises(ValueError, match="boom in the child"):
        child.run(fail, (), "fail", 30, lambda: None)


def test_the_children_run_openblas_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork server sets OPENBLAS_NUM_THREADS=1 before it loads numpy (a thread pool spinning beside onnxruntime's
    is CPU taken from the container step), unless the service's environment sets it: the children's OpenBLAS runs on
    one thread (on this 2-core machine it would take 2)."""
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert child.run(blas_threads, (), "blas", 30, lambda: None) == 1


def test_cancel_kills_the_child(tmp_path: object) -> None:
    """An interrupt ends the wait with CANCELLED (carrying the reason) and the child process is gone."""
    from pathlib import Path

    pidfile = Path(str(tmp_path)) / "pid"

    def cancelled() -> str | None:  # once the child runs (it imports this module first: seconds on a loaded machine)
        return "cancel" if pidfile.exists() and pidfile.read_text() else None

    with pytest.raises(SaigeError) as err:
        child.run(pid_then_sleep, (str(pidfile), 60), "quantize", 60, cancelled)
    assert err.value.code == "CANCELLED" and err.value.fields["reason"] == "cancel"
    assert gone(int(pidfile.read_text()))


def test_timeout_kills_the_child(tmp_path: object) -> None:
    """Past its time limit the child is killed and the step ends TIMEOUT."""
    from pathlib import Path

    pidfile = Path(str(tmp_path)) / "pid"
    with pytest.raises(SaigeError) as err:  # 10 s: the child imports this module before it writes its pid, and that
        child.run(pid_then_sleep, (str(pidfile), 60), "quantize", 10, lambda: None)  # took over 1 s under a load of 14
    assert err.value.code == "TIMEOUT"
    assert gone(int(pidfile.read_text()))


def test_a_memory_bound_above_the_hard_limit_takes_the_hard_limit(tmp_path: object) -> None:
    """Under `prlimit --as=6000000000` (LimitAS=, ulimit -v) a child with a larger configured bound still runs, bound
    by the hard limit instead of failing to raise it."""
    import subprocess
    import sys

    code = ("import resource; from saigeedged.compile import child\n"
            "print(child.run(resource.getrlimit, (resource.RLIMIT_AS,), 'limits', 60, lambda: None,"
            " memory=(25769803776, 'ONNX_INVALID')))")
    done = subprocess.run(["prlimit", "--as=6000000000", sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(6000000000, 6000000000)"


def _bounded(prefix: list[str], size: int, memory_bytes: int) -> dict[str, str]:
    """The error (code, message, bound) of a child that allocates `size` bytes under child.run's memory bound, run in a
    fresh interpreter started with `prefix` (prlimit)."""
    import json
    import subprocess
    import sys

    code = ("import json, numpy; from saigeedged.compile import child; from saigeedged.errors import SaigeError\n"
            "try:\n"
            f"    child.run(numpy.ones, (({size},), 'uint8'), 'accuracy', 120, lambda: None, ({memory_bytes}, 'OUT_OF_MEMORY'))\n"
            "except SaigeError as exc:\n"
            "    print(json.dumps({'code': exc.code, 'message': exc.message, 'bound': exc.fields.get('bound')}))\n")
    done = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


def test_out_of_memory_names_the_address_space_limit_that_struck() -> None:
    """Under `prlimit --as=6000000000` a child that needs 8 GB fails OUT_OF_MEMORY naming RLIMIT_AS and its 6 GB, not
    the (larger, 24 GiB) limits.child_memory_bytes it never reached."""
    err = _bounded(["prlimit", "--as=6000000000"], 8 << 30, 25769803776)
    assert err["code"] == "OUT_OF_MEMORY" and err["bound"] == "RLIMIT_AS", err
    assert "RLIMIT_AS (6000000000 bytes)" in err["message"] and "below limits.child_memory_bytes" in err["message"]


def test_out_of_memory_names_child_memory_bytes_when_it_struck() -> None:
    """Without a hard limit, a child that needs more than limits.child_memory_bytes fails OUT_OF_MEMORY naming it."""
    err = _bounded([], 1 << 30, 256 << 20)
    assert err["code"] == "OUT_OF_MEMORY" and err["bound"] == "limits.child_memory_bytes", err
    assert f"limits.child_memory_bytes ({256 << 20} bytes)" in err["message"]


def test_a_child_killed_by_someone_is_a_loss_not_out_of_memory(tmp_path: Path) -> None:
    """A bounded child SIGKILLed by a `kill -9` (no OOM kill counted by the kernel meanwhile) is CHILD_LOST, retried
    like any loss: it was OUT_OF_MEMORY "killed by the kernel's OOM killer", failed for good."""
    from saigeedged.compile import memorybound

    pidfile = tmp_path / "pid"

    def killed() -> None:  # once the child has written its pid: the operator's `kill -9` of it
        if pidfile.exists() and pidfile.read_text():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)

    with pytest.raises(SaigeError) as err:
        child.run(pid_then_sleep, (str(pidfile), 60), "quantize", 60, lambda: killed(), (1 << 30, "OUT_OF_MEMORY"))
    assert err.value.code == "CHILD_LOST" and "no OOM kill" in err.value.message, err.value
    (tmp_path / "vmstat").write_text("nr_free_pages 1\noom_kill 7\n")
    assert memorybound.oom_kills(tmp_path / "vmstat") == 7 and memorybound.oom_kills(tmp_path / "none") is None


@pytest.mark.parametrize("work", ["pid_then_sleep", "pid_then_hold"])
def test_a_child_ends_with_the_daemon_killed_under_it(tmp_path: Path, work: str) -> None:
    """`kill -9` of the process that asked for a child (the daemon): the child ends too, even while C code holds its
    GIL (onnxruntime's). It computed on beside the retry the next daemon started (a host job's quantize: twice the
    time on two cores) and wrote into its work dir."""
    import subprocess
    import sys

    from harness import wait_for

    pidfile = tmp_path / "pid"
    code = ("from saigeedged.compile import child; import test_child\n"
            f"child.run(test_child.{work}, ({str(pidfile)!r}, 600), 'quantize', 900, lambda: None)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parent,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text(), 120, "the child started")
        owner.kill()
        owner.wait(30)
        wait_for(lambda: gone(int(pidfile.read_text())), 30, "the child ended with its owner")
    finally:
        owner.kill()
        if pidfile.exists() and pidfile.read_text() and not gone(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)  # never left computing for 10 minutes


def test_the_cgroup_memory_limit_is_read_from_v1_and_v2(tmp_path: Path) -> None:
    """The daemon's cgroup limit (the unit's MemoryMax=) is found under cgroup v2's memory.max or v1's
    memory.limit_in_bytes; "max" and v1's no-limit value are no limit."""
    from saigeedged.compile import memorybound

    (tmp_path / "system.slice/saigeedged.service").mkdir(parents=True)
    (tmp_path / "system.slice/saigeedged.service/memory.max").write_text("4294967296\n")
    assert memorybound.cgroup_limit("0::/system.slice/saigeedged.service\n", tmp_path) == 4 << 30
    (tmp_path / "system.slice/saigeedged.service/memory.max").write_text("max\n")
    assert memorybound.cgroup_limit("0::/system.slice/saigeedged.service\n", tmp_path) is None
    (tmp_path / "memory/svc").mkdir(parents=True)
    (tmp_path / "memory/svc/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memorybound.cgroup_limit("4:memory:/svc\n1:cpu:/\n0::/\n", tmp_path) is None
    (tmp_path / "memory/svc/memory.limit_in_bytes").write_text("2147483648\n")
    assert memorybound.cgroup_limit("4:memory:/svc\n1:cpu:/\n0::/\n", tmp_path) == 2 << 30


def test_a_report_is_bounded_by_the_cpu_it_uses_not_by_the_time_compiles_take_from_it(tmp_path: Path) -> None:
    """The report child runs at nice +10: its wall time is what the compiles beside it leave it (CI's loaded machine
    starved a 0.3 s report past a 2 s limits.step_timeout_s, and a job that compiled failed TIMEOUT). It may take
    longer than step_timeout_s while it does not work; step_timeout_s on each core bounds the CPU-seconds it uses
    (TIMEOUT naming them, the child gone), and the job's deadline its wall time."""
    config = configmod.load(write_config(tmp_path, limits={"step_timeout_s": 1}))
    ctx = Context(log=JobLog(tmp_path / "j.log"), step=lambda name: None, config=config,
                  deadline=time.monotonic() + 300)
    prep: Any = SimpleNamespace(held_out=["img0001.jpg"], entry=SimpleNamespace(eval_samples=1))
    made = report.made(prep, report.Plan(idle_report, (3.0,)), ctx)
    assert made["idled"] == 3.0 and made["cost"]["seconds"] >= 3.0
    assert made["cost"]["nice"] == min(19, os.nice(0) + report.REPORT_NICE)

    pidfile = tmp_path / "pid"
    with pytest.raises(SaigeError) as err:
        report.made(prep, report.Plan(busy_report, (str(pidfile),)), ctx)
    cores = len(os.sched_getaffinity(0))
    assert err.value.code == "TIMEOUT" and err.value.message == \
        f"accuracy used more than {cores} CPU-seconds (limits.step_timeout_s on {cores} cores) and was killed"
    assert gone(int(pidfile.read_text()))

    ctx.deadline = time.monotonic() + 2
    with pytest.raises(SaigeError) as err:
        report.made(prep, report.Plan(idle_report, (120.0,)), ctx)
    assert err.value.code == "TIMEOUT"


def test_a_cpu_bound_over_the_services_hard_limit_ends_timeout_naming_that_limit() -> None:
    """Under a hard RLIMIT_CPU of the service's (`prlimit --cpu`, LimitCPU=) below the CPU asked for, the child stops a
    second before it, by SIGXCPU: the job ends TIMEOUT naming that limit (the kernel's SIGKILL at the hard limit would
    have read as the OOM killer's, OUT_OF_MEMORY naming the cgroup)."""
    import json
    import subprocess
    import sys

    code = ("import json; from saigeedged.compile import child; from saigeedged.errors import SaigeError\n"
            "from test_child import busy_report\n"
            "try:\n"
            "    child.run(busy_report, ('/dev/null',), 'accuracy', 120, lambda: None, (25769803776, 'OUT_OF_MEMORY'),"
            " (100, 'limits.step_timeout_s'))\n"
            "except SaigeError as exc:\n"
            "    print(json.dumps({'code': exc.code, 'message': exc.message}))\n")
    done = subprocess.run(["prlimit", "--cpu=6:6", sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180, cwd=Path(__file__).parent)
    assert done.returncode == 0 and done.stdout, done.stderr
    assert json.loads(done.stdout) == {"code": "TIMEOUT", "message": "accuracy used more than 5 CPU-seconds (the "
                                       "service's hard RLIMIT_CPU (6 s), below limits.step_timeout_s) and was killed"}

"""In-process compiler work (onnxruntime) run in a forked child that a stop, a cancel or a timeout can end."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import resource
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

from saigeedged.compile import memorybound
from saigeedged.compile.memorybound import Bound
from saigeedged.errors import Code, SaigeError

POLL_S = 0.2  # how often the parent looks at stop/cancel requests while the child works
EXIT_WAIT_S = 5.0  # a child that closed its pipe without an answer is exiting: its exit code comes within this
# imported once by the fork server, not by each child: a child loads its function by reference, and a module
# the server lacks was imported (compiled, with no .pyc) by every child of every step (issue 21: most of what a
# cache-hit job cost, 0.5 -> 0.2 s a job). onethread first, before numpy loads; ranges and images by name: the host
# backend imports them (and numpy, onnx) only in its child-side functions. compile/preload.py imports them.
MODULES = ["saigeedged.compile.onethread", "saigeedged.compile.backends.host", "onnxruntime.quantization",
           "saigeedged.compile.prepare", "saigeedged.compile.report", "saigeedged.compile.evaluate",
           "saigeedged.compile.ahead", "saigeedged.compile.ranges", "saigeedged.compile.images",
           "saigeedged.compile.backends.mobilint"]
PRELOAD = ["saigeedged.compile.preload"]
NO_MEMORY = 75  # the fork server's exit code when an import of its preload ran out of memory (compile/preload.py)
# how a child dies of its memory bound outside Python: C++ bad_alloc aborts, a NULL from malloc faults, the OOM
# killer kills (a SIGTERM of a stopping unit is not one of them)
CPU_KILL_AFTER_S = 5  # past its CPU bound a child that outlived SIGXCPU is SIGKILLed this many CPU-seconds later
OUT_OF_MEMORY = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGKILL})


def _address_space() -> int:
    """This process's mapped address space now (what RLIMIT_AS counts), in bytes."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * resource.getpagesize()


def _bound(memory_bytes: int) -> Bound:
    """The child's RLIMIT_AS: `memory_bytes` on top of what the forkserver already mapped (onnxruntime's libraries),
    never above the hard limit the service runs under (LimitAS=, ulimit -v): only root may raise that."""
    want = _address_space() + memory_bytes
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return Bound(want, False) if hard == resource.RLIM_INFINITY or hard >= want else Bound(hard, True)


def _cpu_limits(cpu_s: int) -> tuple[int, int]:
    """The (soft, hard) RLIMIT_CPU of a child allowed `cpu_s` CPU-seconds (all its threads): SIGXCPU at the soft limit
    ends it (Python leaves its default action), SIGKILL CPU_KILL_AFTER_S later one that outlived it. Under a finite hard
    limit of the service (LimitCPU=, ulimit -t: only root may raise it) the soft one stays a second below it, so that
    SIGXCPU, not SIGKILL (which reads as the OOM killer's), always ends it."""
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if hard == resource.RLIM_INFINITY:
        return cpu_s, cpu_s + CPU_KILL_AFTER_S
    return max(1, min(cpu_s, hard - 1)), hard


def _die_with(owner: int) -> None:
    """End this child when the daemon that asked for it ends: a `kill -9` of the daemon left a host job's quantize
    computing beside its retry (the fork server's children outlive it). A pidfd of the daemon, watched by a thread."""
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        os._exit(1)  # gone already: nobody waits for this work
    except OSError:
        return  # a kernel without pidfds: as before

    def watch() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    old = threading.stack_size(256 << 10)  # counted against the child's memory bound: a small one
    try:
        threading.Thread(target=watch, name="saigeedged-owner", daemon=True).start()
    finally:
        threading.stack_size(old)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_server() -> None:
    """SIGKILL from the kernel when this child's parent, the fork server, ends, as it does when the daemon dies: _die_with's
    thread cannot run while C code holds the GIL (onnx, onnxruntime), and a child of a `kill -9`ed daemon finished its
    work beside the retry, then wrote a BrokenPipeError traceback into the service's log (a fault campaign).

    The server ends when the write ends of its "alive" pipe are all closed: the daemon's, and each child's (which
    multiprocessing hands every child; ours start no process, they are daemonic). The child's is closed here, so the
    daemon's death ends the server and, by this signal, the child. The signal is asked for first; a server that ended
    before (its pipe has no reader: POLLERR) ends the child at once."""
    import ctypes
    from multiprocessing import forkserver

    try:
        asked = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (AttributeError, OSError):  # not Linux's libc
        asked = False
    if not asked:
        return  # _die_with alone, the alive pipe left as multiprocessing has it
    server = forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)  # private, like _server_status's pid: without it, as before
    if not isinstance(alive, int):
        return
    poller = select.poll()
    poller.register(alive, 0)  # POLLERR is always reported: the read end, the server's alone, is closed
    if any(events & select.POLLERR for _, events in poller.poll(0)):
        os._exit(1)
    with contextlib.suppress(OSError):
        os.close(alive)
    setattr(server, "_forkserver_alive_fd", None)  # noqa: B010 (mypy knows no such attribute)


def _main(conn: Connection, fn: Callable[..., Any], args: Sequence[Any], memory_bytes: int | None,
          cpu_limits: tuple[int, int] | None, owner: int | None = None) -> None:
    if owner is not None:
        _die_with_server()
        _die_with(owner)
    try:
        if cpu_limits is not None:
            resource.setrlimit(resource.RLIMIT_CPU, cpu_limits)
            resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # SIGXCPU
            # dumps core by default: no core file of a process with onnxruntime mapped for a report over its time
        if memory_bytes is not None:
            bound = _bound(memory_bytes)
            resource.setrlimit(resource.RLIMIT_AS, (bound.limit, bound.limit))
            conn.send(bound)  # first, so the parent can name the limit if the work dies of it
        conn.send((True, fn(*args)))
    except BaseException as exc:  # everything goes back to the parent, which decides
        try:
            conn.send((False, exc))
        except (BrokenPipeError, ConnectionResetError):  # the parent is gone: nobody to tell, nothing to print
            os._exit(1)
    finally:
        conn.close()


def run(fn: Callable[..., Any], args: Sequence[Any], label: str, timeout_s: float,
        interrupted: Callable[[], str | None], memory: tuple[int, Code] | None = None,
        cpu: tuple[int, str] | None = None) -> Any:
    """fn(*args) in a child forked from a server with onnxruntime loaded; its result or its exception.

    `cpu` = (CPU-seconds, the setting that gave them): the child may use that much CPU (TIMEOUT past it, naming the
    setting), for work at a low priority whose wall time is what other work leaves it (`timeout_s` then bounds only
    a child that waits without working). A lower hard limit of the service's takes its place (_cpu_limits).

    `memory` = (bytes, code): the child may map that much more; work that needs more fails with `code` (ONNX_INVALID
    for an input too big to validate, OUT_OF_MEMORY for work on valid inputs) naming the bound that struck (see
    memorybound), instead of taking memory from the daemon or the host.

    Keeping onnxruntime out of the daemon matters: its thread pools spin after a run and starved the
    daemon's main loop, and it adds ~50 MB to the daemon's RSS for good.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    parent, child = context.Pipe(duplex=False)
    cpu_limits = _cpu_limits(cpu[0]) if cpu else None
    if cpu is not None and cpu_limits is not None and cpu_limits[0] < cpu[0]:
        cpu = (cpu_limits[0], f"the service's hard RLIMIT_CPU ({cpu_limits[1]} s), below {cpu[1]}")
    proc = context.Process(target=_main, args=(child, fn, args, memory[0] if memory else None, cpu_limits, os.getpid()),
                           name=f"saigeedged-{label}", daemon=True)
    ooms = memorybound.oom_kills()  # a SIGKILL with no OOM kill counted since is someone's `kill`, not memory
    try:
        with _hangup_blocked():
            proc.start()
    except (EOFError, OSError, MemoryError) as exc:
        parent.close()
        child.close()
        starved = _starved(label, exc, ooms)
        if starved is None:
            raise
        raise starved from exc
    child.close()
    try:
        ok, value, bound = _wait(parent, proc, label, timeout_s, interrupted, memory, cpu, ooms)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()
    if not ok:
        raise memorybound.exceeded(label, memory[1], memory[0], bound) if memory and bound and \
            memorybound.allocation_failed(value) else value
    return value


def _wait(parent: Connection, proc: Any, label: str, timeout_s: float, interrupted: Callable[[], str | None],
          memory: tuple[int, Code] | None, cpu: tuple[int, str] | None,
          ooms: int | None = None) -> tuple[bool, Any, Bound | None]:
    """The child's (ok, result or exception) and the memory bound it set; stop, cancel, timeout and death raise."""
    deadline = time.monotonic() + timeout_s
    bound = Bound(memory[0], False) if memory else None
    while True:
        if parent.poll(POLL_S):
            try:
                message = parent.recv()
            except EOFError:  # it died without an answer: killed by a signal (its memory bound, a crash) or exited
                proc.join(EXIT_WAIT_S)
                raise _died(label, proc.exitcode, memory, bound, cpu, ooms) from None
            if not isinstance(message, Bound):
                return message[0], message[1], bound
            bound = message  # the address-space limit the child set, before any work
            continue
        reason = interrupted()
        if reason is not None:
            raise SaigeError("CANCELLED", f"{label} was stopped ({reason})", reason=reason)
        if time.monotonic() > deadline:
            raise SaigeError("TIMEOUT", f"{label} ran longer than {timeout_s:.0f}s and was killed")
        if not proc.is_alive() and not parent.poll():
            raise _died(label, proc.exitcode, memory, bound, cpu, ooms)


def _died(label: str, exitcode: int | None, memory: tuple[int, Code] | None, bound: Bound | None,
          cpu: tuple[int, str] | None, ooms: int | None = None) -> SaigeError:
    """A child killed by a signal under a memory bound ran out of it: C++ allocators abort or fault at RLIMIT_AS, the
    OOM killer SIGKILLs (at the unit's MemoryMax= when the daemon's cgroup has one), unless the kernel counted no OOM
    kill since the child started (`ooms`): then someone's `kill -9`, a loss. SIGXCPU: its CPU bound."""
    if cpu is not None and exitcode == -signal.SIGXCPU:
        return SaigeError("TIMEOUT", f"{label} used more than {cpu[0]} CPU-seconds ({cpu[1]}) and was killed")
    if memory is None or bound is None or exitcode is None or -exitcode not in OUT_OF_MEMORY:
        return SaigeError("CHILD_LOST", f"{label} died with exit code {exitcode}")  # killed: a loss, retried like one
    if memorybound.someones_kill(exitcode, ooms):
        return SaigeError("CHILD_LOST", f"{label} was killed (SIGKILL) and the kernel counted no OOM kill: a `kill`?")
    if -exitcode == signal.SIGKILL:
        return memorybound.killed(label, memory[1], memorybound.own_cgroup_limit())
    return memorybound.exceeded(label, memory[1], memory[0], bound)


def _starved(label: str, exc: BaseException, ooms: int | None) -> SaigeError | None:
    """OUT_OF_MEMORY when the child could not be started for want of memory: the daemon's own allocation or exec
    failed (MemoryError, ENOMEM), or the fork server died of its memory bound (its preload's NO_MEMORY, an allocator's
    abort, the OOM killer); None for any other failure to start. A server that died is started afresh by the next
    child.run (multiprocessing's ensure_running reaps it and starts another)."""
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        what = "could not be started for want of memory"
    else:
        status = _server_status()
        if status is None or not (status == NO_MEMORY or (status < 0 and -status in OUT_OF_MEMORY)):
            return None
        if memorybound.someones_kill(status, ooms):
            return None  # someone's `kill -9` of the server, not the OOM killer
        what = "ran out of memory while it started"
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return memorybound.starved(label, what, None if hard == resource.RLIM_INFINITY else hard,
                               memorybound.own_cgroup_limit())


def _server_status() -> int | None:
    """The fork server's exit status if it has ended (its exit code, or -signal), read without reaping it (the next
    ensure_running reaps it and starts another); None while it runs or when it is unknown. Its stdout closes as it
    exits, a moment before it can be waited for: its pidfd says when."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)  # private: multiprocessing names it nowhere else
    if pid is None:
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        poller = select.poll()  # (select.select refuses a descriptor number past 1023)
        poller.register(fd, select.POLLIN)
        poller.poll(EXIT_WAIT_S * 1000)
    finally:
        os.close(fd)
    try:
        ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped by another thread's start meanwhile
        return None
    if ended is None:
        return None
    return ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status


@contextmanager
def _hangup_blocked() -> Iterator[None]:
    """SIGHUP blocked in this thread while helpers start: the fork server, the resource tracker and every child

    inherit the mask (across fork and exec), so `systemctl kill -s HUP` (every process of the unit) reaches only
    the daemon, which rescans, and never ends a job or a helper. The daemon's own handler runs in the main thread.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def shutdown() -> None:
    """Stop multiprocessing's fork server and resource tracker and reap them, so a stop leaves nothing behind.

    Left alone they exit only once they notice the daemon is gone, after systemd has already SIGKILLed them.
    Call it when no child runs any more: a child still running is killed as the server ends (_die_with_server).
    """
    from multiprocessing import forkserver, resource_tracker

    for helper in (forkserver._forkserver, resource_tracker._resource_tracker):
        stop = getattr(helper, "_stop", None)  # private, but the only way to stop them (CPython's own tests use it)
        if stop is not None:
            stop()

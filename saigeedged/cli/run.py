"""`saigeedged run`: the daemon's entry point (journal set up, signals turned into flags, the service started)."""

from __future__ import annotations

import ctypes
import resource
import signal
import sys
import threading

from saigeedged.adapters import instance
from saigeedged.config import Config
from saigeedged.errors import SaigeError

EXIT_NOT_READY = 3  # cli/main.py's: the environment is not ready
M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def run(config: Config) -> int:
    if not config.named_dirs:
        raise SaigeError("MANIFEST_INVALID", "`run` needs a config that names `inbox` and `outbox`",
                         hint="saigeedged run -c /etc/saigeedged/saigeedged.yml")
    try:
        lock = instance.hold(config.state_dir)
    except instance.Taken as taken:
        print(f"saigeedged: state_dir {config.state_dir} is in use by another `saigeedged run` ({taken}): one daemon "
              "per state_dir\n  hint: stop that one first (`systemctl stop saigeedged`), or give this one a state_dir "
              "of its own", file=sys.stderr)
        return EXIT_NOT_READY
    except OSError as exc:  # a state_dir that takes no new file (full): the daemon still starts and waits for room
        print(f"saigeedged: warning: cannot lock {config.state_dir / instance.NAME} ({exc.strerror}): a second "
              "daemon on this state_dir would not be refused", file=sys.stderr)
        return _serve(config)
    with lock:  # held for the daemon's life
        return _serve(config)


def _one_arena() -> None:
    """Under a hard address-space limit (prlimit --as, LimitAS=), one malloc arena for all the daemon's threads.

    glibc reserves 64 MB of address space for each thread's arena: under a limit of 250 MB the daemon's dozen threads
    took the room their stacks needed ("can't start new thread": it never started), or left the job's children
    none. The daemon's threads mostly wait; sharing one arena costs them nothing measurable.
    """
    if resource.getrlimit(resource.RLIMIT_AS)[1] == resource.RLIM_INFINITY:
        return
    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 1)
    except (AttributeError, OSError):
        pass  # not glibc: its allocator has no such reservations to bound


def _serve(config: Config) -> int:
    from saigeedged.adapters import journal, signals
    from saigeedged.adapters.notify import Notifier
    from saigeedged.service import daemon, room

    _one_arena()  # before the service starts its threads
    journal.configure(config.log.format, config.log.level)
    stop = threading.Event()
    started: list[daemon.Daemon] = []  # the service once it runs: a SIGHUP before then does nothing

    def stopping() -> None:
        stop.set()
        for service in started:
            service.wake.set()  # the main loop stops now, not at its next poll

    def rescan() -> None:
        for service in started:
            service.hang_up()  # not death: a rescan

    signals.Relay({signal.SIGTERM: stopping, signal.SIGINT: stopping, signal.SIGHUP: rescan})
    notifier = Notifier()
    service = room.start_degraded(lambda: daemon.Daemon(config, stop, notifier), stop, notifier)
    if service is None:  # stopped while state_dir was full: nothing was started
        return 0
    started.append(service)
    return service.run()

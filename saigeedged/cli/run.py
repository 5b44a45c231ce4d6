"""`saigeedged run`: the daemon's entry point (journal set up, signals turned into flags, the service started)."""

from __future__ import annotations

import signal
import socket
import threading
from typing import TYPE_CHECKING

from saigeedged.config import Config
from saigeedged.errors import SaigeError

if TYPE_CHECKING:
    from saigeedged.service import daemon


def run(config: Config) -> int:
    if not config.named_dirs:
        raise SaigeError("MANIFEST_INVALID", "`run` needs a config that names `inbox` and `outbox`",
                         hint="saigeedged run -c /etc/saigeedged/saigeedged.yml")
    from saigeedged.adapters import journal
    from saigeedged.adapters.notify import Notifier
    from saigeedged.service import daemon, room

    journal.configure(config.log.format, config.log.level)
    stop = threading.Event()
    relay = _SignalRelay(stop)
    notifier = Notifier()
    service = room.start_degraded(lambda: daemon.Daemon(config, stop, notifier), stop, notifier)
    if service is None:  # stopped while state_dir was full: nothing was started
        return 0
    relay.service = service
    return service.run()


class _SignalRelay(threading.Thread):
    """SIGTERM, SIGINT and SIGHUP as the service's flags, set from a thread of their own, at once.

    The handlers do nothing in Python: the interpreter writes each signal's number to a socket (set_wakeup_fd) that
    this thread reads. So no lock is ever taken in signal context (an Event set by a handler deadlocks if the main
    thread was inside that Event's lock), and the main loop is woken at once instead of at its next poll: a stop
    takes what the stop does, not up to a second more.
    """

    def __init__(self, stop: threading.Event) -> None:
        super().__init__(name="signals", daemon=True)
        self.stop_event = stop
        self.service: daemon.Daemon | None = None  # set once started; a SIGHUP before then does nothing
        self._read, write = socket.socketpair()
        write.setblocking(False)
        self._write = write  # kept open for the process's life: the interpreter writes to its descriptor
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda signum, frame: None)  # a Python handler, so the number reaches the socket
        signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        self.start()

    def run(self) -> None:
        while data := self._read.recv(64):
            for signum in data:
                if signum in (signal.SIGTERM, signal.SIGINT):
                    self.stop_event.set()
                    if self.service is not None:
                        self.service.wake.set()
                elif signum == signal.SIGHUP and self.service is not None:
                    self.service.hang_up()  # not death: a rescan

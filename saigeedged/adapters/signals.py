"""Signals turned into actions run by a thread of their own, at once (the daemon's stop and rescan, a node agent's
stop).

The handlers do nothing in Python: the interpreter writes each signal's number to a socket (signal.set_wakeup_fd)
that the relay's thread reads and acts on. So no lock is ever taken in signal context (an Event set by a handler
deadlocks when the main thread was inside that Event's own lock, e.g. in its wait()), and whoever waits is woken at
once, not at its next poll.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Mapping


class Relay(threading.Thread):
    """Runs `actions[signum]` for each of those signals this process gets; install from the main thread."""

    def __init__(self, actions: Mapping[int, Callable[[], None]]) -> None:
        super().__init__(name="signals", daemon=True)
        self.actions = dict(actions)
        self._read, write = socket.socketpair()
        write.setblocking(False)
        self._write = write  # kept open for the process's life: the interpreter writes to its descriptor
        for signum in self.actions:
            signal.signal(signum, lambda signum, frame: None)  # a Python handler, so the number reaches the socket
        signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        self.start()

    def run(self) -> None:
        while data := self._read.recv(64):
            for signum in data:
                action = self.actions.get(signum)
                if action is not None:
                    action()

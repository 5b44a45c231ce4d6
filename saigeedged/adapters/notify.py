"""The only user of the sd_notify socket: READY, STATUS, WATCHDOG and STOPPING (SPEC §9)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    """Talks to systemd when NOTIFY_SOCKET is set; silent otherwise. Time is passed in.

    Datagrams are sent without blocking: a receiver that stops reading must not freeze the daemon
    (libsystemd's notify blocks in sendmsg while holding the GIL), so a message that does not fit is dropped.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        path = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + path[1:] if path.startswith("@") else path
        self._sock: socket.socket | None = None
        usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
        ours = pid is None or pid == str(os.getpid())
        self.interval = int(usec) / 2e6 if usec and usec.isdigit() and int(usec) > 0 and ours else None
        self._next_ping = 0.0
        self._status = ""
        self._stopping = False

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, text: str) -> bool:
        if not self.address:
            return False
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.sendto(text.encode(), socket.MSG_DONTWAIT, self.address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> None:
        self._status = status
        self.send(f"READY=1\nSTATUS={status}")

    def status(self, text: str) -> None:
        """A new STATUS= line; none after STOPPING (the workers' last changes as they stop said `idle` while a
        container step ran on, detached)."""
        if text != self._status and not self._stopping:
            self._status = text
            self.send(f"STATUS={text}")

    def watchdog(self, now: float) -> None:
        """Ping at half of WATCHDOG_USEC; call only from the loop that knows the daemon is healthy."""
        if self.interval is not None and now >= self._next_ping:
            self.send("WATCHDOG=1")
            self._next_ping = now + self.interval

    def stopping(self) -> None:
        self._stopping = True
        self.send("STOPPING=1\nSTATUS=stopping")

"""sd_notify through a real AF_UNIX datagram socket."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from saigeedged.adapters.notify import Notifier


def bound(tmp_path: Path) -> tuple[socket.socket, str]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(2)
    return sock, path


def test_messages_reach_the_socket(tmp_path: Path) -> None:
    """READY carries the first STATUS; a repeated STATUS is not resent; STOPPING is sent."""
    sock, path = bound(tmp_path)
    n = Notifier({"NOTIFY_SOCKET": path})
    n.ready("idle, 0 queued")
    n.status("idle, 0 queued")
    n.status("compiling det (quantize 8/11), 3 queued")
    n.stopping()
    n.status("idle, 0 queued")  # a worker's last change as it stops: STATUS= stays `stopping`
    got = [sock.recv(1024).decode() for _ in range(3)]
    assert got == ["READY=1\nSTATUS=idle, 0 queued", "STATUS=compiling det (quantize 8/11), 3 queued",
                   "STOPPING=1\nSTATUS=stopping"]
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(1024)


def test_watchdog_interval_is_half_of_usec(tmp_path: Path) -> None:
    """WATCHDOG=1 at most every WATCHDOG_USEC/2, time passed in; another pid's watchdog is ignored."""
    sock, path = bound(tmp_path)
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())})
    assert n.interval == 1.0
    for now in (10.0, 10.5, 10.99, 11.0):
        n.watchdog(now)
    assert [sock.recv(64) for _ in range(2)] == [b"WATCHDOG=1", b"WATCHDOG=1"]
    sock.setblocking(False)
    try:
        extra = sock.recv(64)
    except BlockingIOError:
        extra = b""
    assert extra == b""  # no third ping queued
    assert Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}).interval is None


def test_a_full_socket_never_blocks(tmp_path: Path) -> None:
    """When nobody reads, sends are dropped instead of blocking the daemon."""
    _, path = bound(tmp_path)
    n = Notifier({"NOTIFY_SOCKET": path})
    results = [n.send(f"STATUS={i}") for i in range(5000)]
    assert results[0] and not results[-1]


def test_without_socket_nothing_is_sent() -> None:
    """Off systemd the notifier is silent."""
    assert not Notifier({}).send("READY=1")

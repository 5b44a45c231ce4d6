"""An exec's output read from its raw socket, every wait bounded (SPEC §15: no read blocks for ever on a hung engine).

docker-py's own stream (`exec_start(stream=True)`) waits for each frame in `poll()` without a timeout, so a dockerd
that sent the response headers and then nothing holds the caller for ever, whatever the client's timeout. Here the
socket is taken raw and each wait for bytes is a `select` bounded by the engine timeout; the frames are docker's
multiplexed format (8-byte header: stream type, 3 zero bytes, big-endian payload size), as docker-py reads them.
"""

from __future__ import annotations

import select
import struct
from collections.abc import Callable
from typing import Any

HEADER = struct.Struct(">BxxxL")
CHUNK = 65536


class Stalled(TimeoutError):
    """The engine sent nothing for the engine timeout in the middle of an exec's output (a hung dockerd)."""


def _wait(sock: Any, timeout_s: float) -> None:
    """Return once `sock` has bytes to read (or its end); Stalled after `timeout_s` of silence."""
    buffered = getattr(sock, "pending", None) or getattr(sock, "recv_ready", None)  # TLS records, an ssh channel
    if buffered is not None and buffered():
        return
    ready, _, _ = select.select([sock], [], [], timeout_s)
    if not ready:
        raise Stalled(f"the engine sent nothing for {timeout_s:g}s in the middle of an exec's output")


def _recv(sock: Any, n: int, timeout_s: float) -> bytes:
    _wait(sock, timeout_s)
    data = sock.recv(n) if hasattr(sock, "recv") else sock.read(n)
    return bytes(data or b"")


def _exactly(sock: Any, n: int, timeout_s: float) -> bytes | None:
    """`n` bytes, or None at the end of the stream (a cut connection ends it the same way: exec_inspect decides)."""
    data = b""
    while len(data) < n:
        more = _recv(sock, n - len(data), timeout_s)
        if not more:
            return None
        data += more
    return data


def drain(sock: Any, timeout_s: float, sink: Callable[[bytes], None]) -> None:
    """Pass every payload of the multiplexed stream on `sock` (stdout and stderr alike) to `sink` until its end;
    Stalled when the engine sends nothing for `timeout_s`."""
    while True:
        header = _exactly(sock, HEADER.size, timeout_s)
        if header is None:
            return
        _, size = HEADER.unpack(header)
        while size > 0:
            data = _recv(sock, min(size, CHUNK), timeout_s)
            if not data:
                return
            size -= len(data)
            sink(data)

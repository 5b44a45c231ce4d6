"""The job log: raw compiler bytes plus step banners and timings, written host-local while the job runs."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from saigeedged.jobs import Superseded


class JobLog:
    """Append-only log file; compiler output is written as raw bytes, never decoded.

    `current`: does the store still name the attempt writing it? Fenced like every other write of an attempt (SPEC
    §15): a stale attempt's write raises Superseded instead of landing in the next attempt's log."""

    def __init__(self, path: Path, current: Callable[[], bool] = lambda: True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.current = current
        self._fh = path.open("ab", buffering=0)
        self._started: float | None = None
        self._step = ""
        self._lost = 0  # bytes a full state_dir refused since the last write that landed

    def write(self, data: bytes) -> None:
        """Append `data`; on a full state_dir the bytes are dropped, counted, and the count written once there is
        room again: a full disk never fails the job for its log (issue 26)."""
        if not self.current():
            raise Superseded(f"{self.path.name}: the attempt writing it is over")
        if self._lost and self._append(f"\n[{self._lost} bytes of output lost: state_dir was full]\n".encode()) == 0:
            self._lost = 0
        self._lost += self._append(data)

    def _append(self, data: bytes) -> int:
        """Write all of `data` (a full disk may take part of it); the bytes it refused."""
        view = memoryview(data)
        try:
            while view:
                view = view[self._fh.write(view) or 0:]
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
        return len(view)

    def line(self, text: str) -> None:
        self.write(text.encode(errors="surrogateescape") + b"\n")  # a name that is not UTF-8 keeps its bytes

    def begin(self, step: str, index: int, count: int) -> None:
        self.end()
        self._step, self._started = step, time.monotonic()
        self.line(f"===== [{index}/{count}] {step} ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}) =====")

    def end(self, outcome: str = "ok") -> None:
        if self._started is not None:
            self.line(f"----- {self._step}: {outcome} in {time.monotonic() - self._started:.2f}s")
            self._started = None

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> JobLog:
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        self.close()

"""A compiler step started detached in its container and followed through files of the attempt's work dir (SPEC §15).

The step belongs to its attempt, not to the daemon: a wrapper run by a detached exec writes the step's output to
`.steps/<n>.log`, its pids to the work dir's pidfile and, when it ends, its exit code to `.steps/<n>.rc`. The
daemon follows the log and waits for the exit code by reading those files through the bind mount (or the work
share of executor slurm), so a daemon that stops, restarts or is killed finds the step again by its number and
re-attaches, or reads the code of a step that ended.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from saigeedged.adapters.docker.api import APIError, DockerAPI
from saigeedged.errors import SaigeError

STEPS_DIR = ".steps"  # the detached steps' logs, exit codes and exec ids

POLL_S = (0.005, 0.05)  # between looks at a step's files (a file read, no engine call): from the first to the
# longest, doubling, so a short step ends within milliseconds and a long one costs a stat every 50 ms
LIVENESS_S = 2.0  # how often the engine is asked whether the step's exec still runs
# $0 = .steps/<n> (no suffix), $1 = the pidfile, then timeout's argv. The wrapper writes its own pid and then the
# step's (timeout's, GNU's the head of its own process group) to the pidfile, so a kill reaches both process groups;
# it traps TERM so that a cancel's kill still leaves an exit code; the code is written by rename, whole or not at all.
WRAP = ('s=$0; p=$1; shift; echo $$ > "$p"; '
        'if [ -e "${p%.pid}.stop" ]; then c=143; else '
        'trap : TERM INT HUP; "$@" > "$s.log" 2>&1 < /dev/null & k=$!; echo $k >> "$p"; '
        'while :; do wait $k; c=$?; kill -0 $k 2>/dev/null || break; done; fi; '
        'rm -f "$p"; echo $c > "$s.rc.tmp" && mv -f "$s.rc.tmp" "$s.rc"')
Sink = Callable[[bytes], None]
Stopping = Callable[[], bool]
Reach = Callable[[str], contextlib.AbstractContextManager[None]]  # times an engine call, maps it unreachable


class Book(Protocol):
    """Where the daemon keeps what it knows of a step beside the step's own files: the wrapper's exec id (so the step
    is followed, never started twice) and how much of its log the job log already has. The daemon's book is the
    attempt's record in the store (SPEC §15: nothing of it in a folder the container can write); FileBook keeps it
    beside the step for a process without records (`saigeedged compile`, and tests of the steps alone)."""

    def launched(self, work: Path, n: int, exec_id: str) -> None:
        """Step `n` is about to start as exec `exec_id` (raises if the attempt is over: it must not start)."""

    def exec_id(self, work: Path, n: int) -> str | None:
        """The exec id of step `n`, None when it was never started."""

    def seen(self, work: Path, n: int) -> int:
        """Bytes of step `n`'s log already copied into the job log (by this daemon or the one before)."""

    def mark_seen(self, work: Path, n: int, offset: int) -> None: ...


class FileBook:
    """A Book in files beside the steps' own (`.steps/<n>.exec`, `.steps/<n>.seen`)."""

    @staticmethod
    def _path(work: Path, n: int, suffix: str) -> Path:
        return work / STEPS_DIR / f"{n}.{suffix}"

    def launched(self, work: Path, n: int, exec_id: str) -> None:
        self._path(work, n, "exec").write_text(exec_id)

    def exec_id(self, work: Path, n: int) -> str | None:
        try:
            return self._path(work, n, "exec").read_text().strip() or None
        except FileNotFoundError:
            return None

    def seen(self, work: Path, n: int) -> int:
        try:
            return int(self._path(work, n, "seen").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def mark_seen(self, work: Path, n: int, offset: int) -> None:
        self._path(work, n, "seen").write_text(str(offset))


@dataclass
class Files:
    """The files of step `n` of the attempt whose work dir is `work` (host-side paths), and its `book`."""

    work: Path
    n: int
    book: Book = field(default_factory=FileBook)

    @property
    def base(self) -> Path:
        return self.work / STEPS_DIR / str(self.n)

    def path(self, suffix: str) -> Path:
        return self.base.with_name(f"{self.n}.{suffix}")

    def started(self) -> bool:
        return self.book.exec_id(self.work, self.n) is not None

    def exec_id(self) -> str:
        return self.book.exec_id(self.work, self.n) or ""

    def seen(self) -> int:
        """Bytes of the step's log already copied into the job log (by this daemon or the one before)."""
        return self.book.seen(self.work, self.n)

    def mark_seen(self, offset: int) -> None:
        self.book.mark_seen(self.work, self.n, offset)


def never_started(info: dict[str, Any]) -> bool:
    """An exec (its inspect) that was created and never started: no process, no exit code."""
    return not info.get("Running", False) and info.get("ExitCode") is None and not info.get("Pid")


def code_of(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else None


class Follower:
    """Follows one detached step until it ends, reading its files on the host; `api` tells whether its exec runs."""

    def __init__(self, api: DockerAPI | None, files: Files, sink: Sink, replay: Sink | None,
                 reach: Reach = lambda doing: contextlib.nullcontext(),
                 may_start: Callable[[str], None] = lambda exec_id: None) -> None:
        self.api, self.files, self.reach, self.may_start = api, files, reach, may_start
        self.sink, self.replay = sink, replay
        self.offset = 0  # bytes of the step's log read so far
        self.seen = files.seen()
        self._checked = time.monotonic()

    def _feed(self, data: bytes) -> None:
        """New log bytes: those the job log already has (before a re-attach) only to `replay`, the rest to both."""
        start, self.offset = self.offset, self.offset + len(data)
        old = data[: max(0, self.seen - start)]
        new = data[len(old):]
        if old and self.replay is not None:
            self.replay(old)
        if new:
            self.sink(new)
            self.seen = self.offset
            self.files.mark_seen(self.seen)

    def _look(self) -> int | None:
        """Read what the step wrote since the last look; its exit code once it has ended."""
        code = self._local_code()
        try:
            with self.files.path("log").open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:  # the wrapper has not started the step yet
            data = b""
        if data:
            self._feed(data)
        return code

    def _local_code(self) -> int | None:
        try:
            return code_of(self.files.path("rc").read_text())
        except FileNotFoundError:
            return None

    def _gone(self) -> bool:
        """Has the wrapper's exec ended without leaving an exit code (its container died or was recreated)? One that
        was created but never started (a daemon killed between the two calls, its watchdog's kill of a frozen one) is
        started now, once `may_start(exec_id)` allows it (it raises for a cancelled job or an attempt that is over): the step
        never ran, and its attempt is not spent on that. Its own timeout counts from this start."""
        assert self.api is not None, "a follower without an engine says itself whether its step is gone"
        exec_id = self.files.exec_id()
        with self.reach(f"asking whether step {self.files.n} runs"):  # the one engine call of a step's follow
            try:
                info = self.api.api.exec_inspect(exec_id)
            except APIError as exc:
                if exc.status_code == 404:  # gone with its container (a stopped container's execs go with it)
                    return True
                raise
            if never_started(info):
                self.may_start(exec_id)
                try:
                    self.api.api.exec_start(exec_id, detach=True)
                except APIError as exc:
                    if exc.status_code != 409:  # started meanwhile, or its container is not running: the next look
                        raise  # tells (an exit code, or a 404 once the container's execs are gone)
                return False
        return not info.get("Running", False)

    def follow(self, stopping: Stopping) -> int:
        """The step's exit code; CONTAINER_LOST when it vanished; `stopping()`: leave it running (CANCELLED, stop)."""
        poll = POLL_S[0]
        while True:
            code = self._look()
            if code is not None:
                return code
            if stopping():
                raise SaigeError("CANCELLED", "the daemon stops; the step runs on and is re-attached at the next start",
                                 reason="stop", detached=True)
            if time.monotonic() - self._checked >= LIVENESS_S:
                self._checked = time.monotonic()
                if self._gone():
                    code = self._look()  # it may have ended between the two looks
                    if code is not None:
                        return code
                    raise SaigeError("CONTAINER_LOST", f"step {self.files.n} left no exit code: its container died "
                                     "or was recreated under it")
            time.sleep(poll)
            poll = min(poll * 2, POLL_S[1])

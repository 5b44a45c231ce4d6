"""Running one compiler call in a container: argv logged, per-step timeout, exit code mapped (SPEC §6, §6b)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from saigeedged import files
from saigeedged.errors import SaigeError

if TYPE_CHECKING:
    from saigeedged.adapters.docker import Container
    from saigeedged.compile.backends import Context

TIMED_OUT = (124, 137)  # coreutils timeout: timed out / killed after --kill-after


class StepRunner:
    """Calls `prefix + args` in the container, in the work dir, under the step and job time limits."""

    def __init__(self, ctx: Context, ctr: Container, work: Path, prefix: Sequence[str], tool: str,
                 env: dict[str, str] | None = None) -> None:
        self.ctx, self.ctr, self.work, self.prefix, self.tool, self.env = ctx, ctr, work, list(prefix), tool, env

    def call(self, args: Sequence[str], on_chunk: Callable[[bytes], None] | None = None,
             number: int | None = None) -> tuple[int, bytes]:
        """Run and return (exit code, output); output is also streamed to the job log. Raises TIMEOUT. `number`: the
        step's own number (Container.run_step), else the next in the attempt's order."""
        captured = bytearray()

        def replay(chunk: bytes) -> None:  # output of a step re-attached after a restart that the job log already has
            captured.extend(chunk)
            if on_chunk is not None:
                on_chunk(chunk)

        def sink(chunk: bytes) -> None:
            self.ctx.log.write(chunk)
            replay(chunk)

        argv = self.prefix + list(args)
        self.ctx.log.line(f"$ {shlex.join(argv)}")
        limit = self.ctx.step_timeout()
        code = self.ctr.run_step(argv, self.work, limit, sink, self.env, replay,
                                 stopping=lambda: self.ctx.interrupted() == "stop", number=number)
        if code in TIMED_OUT:
            raise SaigeError("TIMEOUT", f"`{self.label(args)}` ran longer than {limit}s and was killed")
        return code, bytes(captured)

    def label(self, args: Sequence[str]) -> str:
        return " ".join([self.tool, *args[:2]]) if args and not args[0].startswith("-") else self.tool

    def failed(self, args: Sequence[str], code: int, output: bytes) -> SaigeError:
        """STEP_FAILED with the compiler's own last lines (`output`: what the call printed), not the job log's, whose
        tail is the daemon's step banners when the call printed little."""
        lines = output.decode(errors="replace").splitlines()[-20:]
        said = "last lines:\n" + "\n".join(lines) if lines else "it printed nothing"
        return SaigeError("STEP_FAILED", f"`{self.label(args)}` exited {code}; {said}")


class Lines:
    """Splits streamed chunks into complete lines (a chunk can end mid-line or mid-character)."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self._buf = b""
        self._on_line = on_line

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self._on_line(line.decode(errors="replace"))

    def flush(self) -> None:
        if self._buf:
            self._on_line(self._buf.decode(errors="replace"))
            self._buf = b""


def read_output(path: Path, work: Path) -> str:
    """The text of a file a compiler step wrote in the attempt's folder `work`, read only as a regular file there
    (files.open_output): never a host file a step's symbolic link points to."""
    try:
        with files.open_output(path, work) as fh:
            return fh.read().decode(errors="replace")
    except files.NotOutput as exc:
        raise SaigeError("STEP_FAILED", f"{exc}, where a compiler step writes its own file: not read") from None


def rewrite(path: Path, work: Path, change: Callable[[str], str]) -> Path:
    """Edit a file a compiler step wrote in the attempt's folder `work` (cubie's inputmeta, its .quantize): read as
    read_output reads, written back by rename, so a symbolic link a step left in its place is neither read (a host
    file) nor written through."""
    files.write_bytes(path, change(read_output(path, work)).encode())
    return path

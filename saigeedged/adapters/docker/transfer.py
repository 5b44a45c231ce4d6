"""A job's work dir on a remote engine (no shared filesystem): one tar in by put_archive before a step, the files
the step wrote back by get_archive after it (SPEC §11).

Both sides are compared with what was last copied, so the calibration images go in once, and only what a step
wrote comes back. The container's files are listed with `stat` (seconds): a step that rewrites a file with the
same size within the second it was copied in is not seen; compilers write new files.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from saigeedged.adapters.docker.api import ContainerRef, DockerAPI

Run = Callable[[list[str]], bytes]  # runs a fixed argv in the container, returns its output (raises on failure)
SKIP = (".step.pid", ".step.stop")  # the step's own control files: written on each side by their owner
STEPS_DIR = ".steps"  # the detached steps' logs, exit codes and exec ids: read in place on each side, never copied
LIST_FORMAT = "%s %Y %n"  # stat's size, mtime (s) and name: one line per file of the container's work dir


@dataclass
class WorkSync:
    """What of one work dir each side has, as of the last copy: host (size, mtime_ns), container (size, mtime_s)."""

    work: Path
    owner: tuple[int, int]
    host: dict[str, tuple[int, int]] = field(default_factory=dict)
    remote: dict[str, tuple[int, int]] = field(default_factory=dict)
    started: bool = False

    def push(self, api: DockerAPI, ctr: ContainerRef, run: Run) -> int:
        """Copy what changed on the host since the last copy (the whole dir the first time); returns bytes sent."""
        if not self.started:  # another attempt may have left files of the same name: start from an empty dir
            run(["rm", "-rf", str(self.work)])
            self.started = True
        changed = [(rel, st) for rel, st in _walk(self.work) if self.host.get(rel) != (st.st_size, st.st_mtime_ns)]
        if not changed and self.host:
            return 0
        with tempfile.TemporaryFile() as spool:  # streamed to the engine from a file: never whole in memory
            self._tar(changed, spool)
            sent = spool.tell()
            spool.seek(0)
            api.api.put_archive(ctr.id, "/", spool)
        for rel, st in changed:
            self.host[rel] = (st.st_size, st.st_mtime_ns)
            self.remote[rel] = (st.st_size, int(st.st_mtime))
        return sent

    def _tar(self, files: list[tuple[str, os.stat_result]], out: IO[bytes]) -> None:
        uid, gid = self.owner
        with tarfile.open(fileobj=out, mode="w|") as tar:
            folders = {p for rel, _ in files for p in (self.work / rel).parents if p.is_relative_to(self.work)}
            for folder in sorted(folders | {self.work}):
                info = tarfile.TarInfo(str(folder).lstrip("/"))
                info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
                tar.addfile(info)
            for rel, st in files:
                info = tarfile.TarInfo(str(self.work / rel).lstrip("/"))
                info.size, info.mode, info.mtime, info.uid, info.gid = st.st_size, st.st_mode & 0o777, st.st_mtime, uid, gid
                with (self.work / rel).open("rb") as fh:
                    tar.addfile(info, fh)

    def pull(self, api: DockerAPI, ctr: ContainerRef, run: Run, listing: bytes | None = None) -> int:
        """Copy back what the container has new or changed since the last copy; returns bytes received.

        `listing`: the container's work dir as `size mtime path` lines (LIST_FORMAT); without it, it is listed here.
        """
        if listing is None:
            listing = run(["find", str(self.work), "-type", "f", "-exec", "stat", "-c", LIST_FORMAT, "{}", "+"])
        changed: dict[str, tuple[int, int]] = {}
        for line in listing.decode(errors="replace").splitlines():
            size, mtime, name = line.split(" ", 2)
            rel = PurePosixPath(name).relative_to(self.work).as_posix()
            if not _control(rel) and self.remote.get(rel) != (int(size), int(mtime)):
                changed[rel] = (int(size), int(mtime))
        received = 0
        for top in sorted({rel.split("/", 1)[0] for rel in changed}):
            stream, _ = api.api.get_archive(ctr.id, str(self.work / top))
            received += self._extract(stream, changed)
        return received

    def _extract(self, stream: Iterator[bytes], wanted: dict[str, tuple[int, int]]) -> int:
        """Write the wanted regular files of a get_archive stream under the work dir (nothing else: names are ours)."""
        chunks = _Chunks(stream)
        with tarfile.open(fileobj=chunks, mode="r|") as tar:  # read as it arrives: never whole in memory
            for member in tar:
                rel = PurePosixPath(member.name).as_posix()
                source = tar.extractfile(member) if member.isfile() and rel in wanted else None
                if source is None:
                    continue
                dest = self.work / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{dest.name}.pull")
                with tmp.open("wb") as out:
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
                tmp.chmod(member.mode & 0o777 | 0o600)
                os.utime(tmp, (member.mtime, member.mtime))
                tmp.replace(dest)
                st = dest.stat()
                self.host[rel], self.remote[rel] = (st.st_size, st.st_mtime_ns), wanted[rel]
        return chunks.received


def _walk(work: Path) -> list[tuple[str, os.stat_result]]:
    found = []
    for folder, _, names in os.walk(work):
        for name in names:
            path = Path(folder) / name
            rel = path.relative_to(work).as_posix()
            if not _control(rel) and path.is_file() and not path.is_symlink():
                found.append((rel, path.stat()))
    return sorted(found)


def _control(rel: str) -> bool:
    return rel in SKIP or rel.startswith(f"{STEPS_DIR}/")


def owner_ids(user: str) -> tuple[int, int]:
    """The uid:gid the files are given in the container (the exec user's, so steps may write beside them)."""
    uid, _, gid = user.partition(":")
    return (int(uid), int(gid or uid)) if uid.isdigit() and (not gid or gid.isdigit()) else (0, 0)


class _Chunks(io.RawIOBase):
    """A get_archive stream (an iterator of byte chunks) as the file tarfile's stream mode reads from."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._left, self.received = chunks, b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left, self.received = chunk, self.received + len(chunk)
        n = min(len(buffer), len(self._left))
        buffer[:n], self._left = self._left[:n], self._left[n:]
        return n

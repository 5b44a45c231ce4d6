"""File helpers light enough for the short-lived commands (`submit` imports neither onnx nor docker).

The one atomic write of saigeedged (temp name beside the file, fsync, rename, fsync the folder; optionally never
replacing an existing file), the daemon's own folder name, digests.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

OWN_DIR = ".saigeedged"  # the daemon's own folder in the inbox: <inbox>/.saigeedged/claimed, .../failed
# temp files' names: .<name>.<8 of mkstemp's letters>.tmp (and .<name>.<pid>.tmp, as releases before made them)
TEMP_NAME = re.compile(r"^\..+\.(\d+|[a-z0-9_]{8})\.tmp$")
_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once, at import (one thread then): the mode open() would give a new file
NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK})  # shares without hard links


def sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder: so a rename in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# this process's temp files being written now (this module owns the set): the start-up sweep of temp files a kill
# left behind runs beside the daemon's first writes and must not take theirs. A name is entered (under the lock, no I/O
# there) before its file is made (O_EXCL), so the sweep never sees one of ours unentered: it took a status file's temp
# file in the gap mkstemp-then-enter left, and the write failed
WRITING: set[Path] = set()
WRITING_LOCK = threading.Lock()


def remove_leftover(path: Path) -> bool:
    """Remove a temp file a killed writer left (True), unless this process writes it now or it is gone already. Safe
    outside the lock: a name of ours that is not entered yet cannot be made while the leftover holds it (O_EXCL)."""
    with WRITING_LOCK:
        if path in WRITING:
            return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _enter(tmp: Path) -> bool:
    with WRITING_LOCK:
        if tmp in WRITING:
            return False
        WRITING.add(tmp)
        return True


def open_temp(dest: Path) -> tuple[int, Path]:
    """A new temp file beside `dest`, `.<name>.<random>.tmp`: unique per call, so two threads writing one name never
    share it; hidden from the inbox scan; a long name cut so it fits NAME_MAX; entered in WRITING before it is made.
    Mode as open() would create it."""
    while True:
        tmp = dest.parent / f".{dest.name[:200]}.{secrets.token_hex(4)}.tmp"
        if not _enter(tmp):
            continue
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # a leftover of that name (or another process's): another name
            WRITING.discard(tmp)
        except BaseException:
            WRITING.discard(tmp)
            raise


def atomic_write(dest: Path, fill: Callable[[BinaryIO], object], *, exclusive: bool = False,
                 tmp: Path | None = None, commit: Callable[[], object] | None = None) -> bool:
    """`fill` writes a temp file beside `dest` (or `tmp`), fsync, rename onto `dest`, fsync the folder.

    `exclusive`: never replace an existing `dest` (False then, the temp file removed). `commit()`: called just before
    the rename; what it raises stops the write there. Any error before the rename removes the temp file and
    propagates; once `dest` is in place the write is done (True), whatever the folder's fsync says.
    """
    if tmp is None:
        fd, tmp = open_temp(dest)
    else:
        _enter(tmp)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        except BaseException:
            WRITING.discard(tmp)
            raise
    try:
        with os.fdopen(fd, "wb") as out:
            fill(out)
            out.flush()
            os.fsync(out.fileno())
        if commit is not None:
            commit()
        if not exclusive:
            os.replace(tmp, dest)
        elif not take(tmp, dest):
            tmp.unlink()
            return False
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only share refuses the cleanup too: the first error is the one
            tmp.unlink(missing_ok=True)
        raise
    finally:
        WRITING.discard(tmp)
    # `dest` is in place: a folder that then refuses its fsync (EIO on a share, a write-only drop folder the daemon
    # cannot open) must not make the write look undone, or its caller writes it again (a bundle's second copy, x.1)
    with contextlib.suppress(OSError):
        fsync_path(dest.parent)
    return True


@contextlib.contextmanager
def _step_folder(folder: Path) -> Iterator[int]:
    """A descriptor of `folder`, a folder a compiler step writes, never of a link a step put in its place (OSError)."""
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        yield dfd
    finally:
        os.close(dfd)


def write_in(folder: Path, name: str, data: bytes) -> None:
    """A small file `name` in `folder`, a folder a compiler step writes: never written through a link a step put there
    (the file's, replaced; or the folder's: OSError). Not atomic: a marker, read whole or not at all."""
    with _step_folder(folder) as dfd:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666 & ~_UMASK, dir_fd=dfd)
        with os.fdopen(fd, "wb") as out:
            out.write(data)


def remove_in(folder: Path, name: str) -> None:
    """Remove `name` from `folder` (a link itself, never its target; nothing through a folder that is a link)."""
    with _step_folder(folder) as dfd, contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dfd)


def write_bytes(dest: Path, data: bytes, *, exclusive: bool = False, tmp: Path | None = None) -> bool:
    """`data` to `dest` atomically (see atomic_write)."""
    return atomic_write(dest, lambda out: out.write(data), exclusive=exclusive, tmp=tmp)


def copy_file(src: Path, dest: Path, *, exclusive: bool = False, tmp: Path | None = None,
              nofollow: bool = False, commit: Callable[[], object] | None = None) -> bool:
    """A copy of `src` to `dest` atomically (see atomic_write); `nofollow`: `src` only as a regular file of its own
    folder (open_output: a bundle in a work folder the next job's step could swap for a link), else NotOutput."""
    def fill(out: BinaryIO) -> None:
        with open_output(src) if nofollow else src.open("rb") as fh:
            shutil.copyfileobj(fh, out, 1 << 20)
    return atomic_write(dest, fill, exclusive=exclusive, tmp=tmp, commit=commit)


def take(tmp: Path, dest: Path) -> bool:
    """Move the finished `tmp` to `dest` unless `dest` exists (False then, `tmp` left for the caller).

    A name is taken by a hard link, which fails if it exists.
    """
    try:
        os.link(tmp, dest)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in NO_LINKS:
            raise
        if os.path.lexists(dest):  # without links the check and the rename are two calls: the best a share allows
            return False
        os.replace(tmp, dest)
        return True
    with contextlib.suppress(OSError):  # `dest` is taken: a temp name left over is the start-up sweep's
        os.unlink(tmp)
    return True


def written_inside(path: Path, root: Path) -> str | None:
    """Why `path`, a file a compiler step wrote under `root` (its attempt's folder), must not be read as its output
    (None: a regular file there). A step can plant a symbolic link in its folder to any path of the daemon's host:
    followed, the daemon would bundle, cache and publish that file (the database with the manifests' passwords)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(mode):
        return f"a symbolic link to {os.readlink(path)}"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    if not path.resolve().is_relative_to(root.resolve()):
        return f"outside the attempt's folder ({path.resolve()})"
    return None


class NotOutput(OSError):
    """A file a compiler step should have written is not one to read (open_output)."""


def open_output(path: Path, root: Path | None = None) -> BinaryIO:
    """`path` opened for reading as written_inside accepts it under `root` (by default its own folder), the check and
    the read on one open file: a link a step swaps in after the check (the next job's step shares the work root while
    this one is bundled) is refused by O_NOFOLLOW, anything but a regular file by fstat (opened without blocking: a
    FIFO swapped in would wait for a writer for ever). NotOutput saying why otherwise."""
    why = written_inside(path, root or path.parent)
    if why is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO swapped in never blocks it
        except OSError as exc:
            why = f"not a file to read ({exc.strerror})"
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.set_blocking(fd, True)
                return os.fdopen(fd, "rb")
            os.close(fd)
            why = "not a regular file"
    raise NotOutput(f"{path.name} is {why}")

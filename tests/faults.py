"""Fault injection on real parts: read-only remounts and small full filesystems, made by the test and undone after."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root (CI runs as root)")


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def set_read_only(folder: Path, read_only: bool) -> None:
    """Remount the bind mount at `folder` (see bind_mount) read-only or read-write."""
    _mount("-o", f"remount,bind,{'ro' if read_only else 'rw'}", str(folder))


@contextlib.contextmanager
def bind_mount(folder: Path, read_only: bool = False) -> Iterator[Path]:
    """`folder` bind-mounted on itself, so it can be remounted read-only while the rest stays writable."""
    folder.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(folder), str(folder))
    try:
        if read_only:
            set_read_only(folder, True)
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


@contextlib.contextmanager
def full_fs(folder: Path, size: str = "512k") -> Iterator[Path]:
    """`folder` as a small tmpfs filled up by <folder>/.filler (delete or truncate it to make room)."""
    folder.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
    try:
        filler = folder / ".filler"
        with filler.open("wb", buffering=0) as fh:
            with contextlib.suppress(OSError):  # ENOSPC: the tmpfs is full
                while True:
                    fh.write(b"\0" * 4096)
        yield filler
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)

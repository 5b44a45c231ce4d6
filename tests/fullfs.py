"""A small tmpfs to fill up (a full state_dir, issue 17): mounted for one test, unmounted after (root only)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's `size=`) at `folder`, unmounted when done; the test is skipped without root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(folder: Path) -> Path:
    """Take every free byte of the filesystem of `folder` with one file (removed to give the space back)."""
    big = folder / "big"
    fd = os.open(big, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):  # down to the last byte: nothing is left for a new page
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return big

"""The one atomic write: a reader sees the old file or the whole new one, and a failure leaves no temp file."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import pytest

from saigeedged import files


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    """A writer that fails half-way leaves `dest` as it was and removes its temp file."""
    dest = tmp_path / "status.json"
    dest.write_bytes(b"old")

    def fill(out: BinaryIO) -> None:
        out.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        files.atomic_write(dest, fill)
    assert dest.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_exclusive_never_replaces(tmp_path: Path) -> None:
    """With exclusive=True an existing name is refused (False) and kept; a free one is taken; no temp is left."""
    taken, free = tmp_path / "det.saigeedge", tmp_path / "other.saigeedge"
    taken.write_bytes(b"first job's")
    assert files.write_bytes(taken, b"second job's", exclusive=True) is False
    assert files.write_bytes(free, b"second job's", exclusive=True) is True
    assert taken.read_bytes() == b"first job's" and free.read_bytes() == b"second job's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["det.saigeedge", "other.saigeedge"]


def test_temp_names_are_hidden_and_recognised(tmp_path: Path) -> None:
    """The temp name is hidden (the inbox scan skips dot files), fits NAME_MAX and matches TEMP_NAME (recovery)."""
    name = files.temp_name(tmp_path / ("x" * 250 + ".saigeedge")).name
    assert name.startswith(".") and len(name) <= 255 and files.TEMP_NAME.match(name)


def test_copy_replaces_whole(tmp_path: Path) -> None:
    """copy_file replaces `dest` with the whole of `src`."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.write_bytes(b"new" * 100_000)
    dest.write_bytes(b"old")
    assert files.copy_file(src, dest)
    assert dest.read_bytes() == src.read_bytes()

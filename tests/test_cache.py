"""The cache store (SPEC §12): atomic entries, verified hits, LRU eviction at max_bytes, `saigeedged cache ls|clear`."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from saigeedged import config as configmod
from saigeedged.adapters.cache import Cache, command
from saigeedged.cli import main as cli


def artifact(tmp_path: Path, name: str, size: int) -> Path:
    path = tmp_path / "work" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def test_put_then_get_gives_the_same_bytes(tmp_path: Path) -> None:
    """A stored entry comes back byte for byte in the destination folder, with its meta."""
    cache = Cache(tmp_path / "cache", 10_000)
    src = artifact(tmp_path, "a.nb", 500)
    assert cache.put("k1", {"m0": src}, {"source_job_id": "job-1"})
    meta = cache.get("k1", tmp_path / "dest")
    assert meta is not None and meta["source_job_id"] == "job-1"
    assert (tmp_path / "dest" / "m0").read_bytes() == src.read_bytes()
    assert cache.get("k2", tmp_path / "dest2") is None


def test_a_temporary_folder_is_never_an_entry(tmp_path: Path) -> None:
    """What a writer killed mid-put leaves (a .tmp- folder with a part of the files) is no hit, and is swept."""
    cache = Cache(tmp_path / "cache", 10_000)
    half = tmp_path / "cache" / ".tmp-k1-999999"
    half.mkdir(parents=True)
    (half / "m0").write_bytes(b"half")
    (half / "meta.json").write_text(json.dumps({"files": {"m0": {"sha256": "x", "bytes": 4}}}))
    assert cache.get("k1", tmp_path / "dest") is None and cache.entries() == []
    cache.put("k2", {"m0": artifact(tmp_path, "b", 10)}, {})
    assert not half.exists()


def test_a_damaged_entry_is_a_miss_and_a_new_put_replaces_it(tmp_path: Path) -> None:
    """A file whose digest no longer matches meta.json makes the entry a miss; storing the key again repairs it."""
    cache = Cache(tmp_path / "cache", 10_000)
    src = artifact(tmp_path, "a.nb", 100)
    cache.put("k1", {"m0": src}, {})
    (tmp_path / "cache" / "k1" / "m0").write_bytes(b"x" * 100)
    assert cache.get("k1", tmp_path / "dest") is None
    cache.put("k1", {"m0": src}, {})
    assert cache.get("k1", tmp_path / "dest") is not None


def test_least_recently_used_entries_go_first_at_max_bytes(tmp_path: Path) -> None:
    """Beyond max_bytes the entry used longest ago is evicted; a hit counts as a use; the new entry stays."""
    cache = Cache(tmp_path / "cache", 2500)
    for i, key in enumerate(("old", "mid")):
        cache.put(key, {"m0": artifact(tmp_path, key, 1000)}, {})
        os.utime(tmp_path / "cache" / key / "meta.json", (1000 + i, 1000 + i))
    assert cache.get("old", tmp_path / "d") is not None  # now the most recently used
    cache.put("new", {"m0": artifact(tmp_path, "new", 1000)}, {})
    assert sorted(e.key for e in cache.entries()) == ["new", "old"]
    assert sum(e.size for e in cache.entries()) <= 2500


def test_an_artifact_larger_than_the_cache_is_not_kept(tmp_path: Path) -> None:
    """An artifact larger than max_bytes is not stored and evicts nothing; max_bytes 0 stores nothing."""
    cache = Cache(tmp_path / "cache", 1500)
    cache.put("small", {"m0": artifact(tmp_path, "s", 1000)}, {})
    assert not cache.put("huge", {"m0": artifact(tmp_path, "h", 2000)}, {})
    assert [e.key for e in cache.entries()] == ["small"]
    assert not Cache(tmp_path / "off", 0).put("k", {"m0": artifact(tmp_path, "z", 1)}, {})


def test_cache_ls_and_clear_commands(tmp_path: Path, config_path: Path) -> None:
    """`cache ls` lists each entry with its source job and the total; `cache clear` empties it."""
    config = configmod.load(config_path)
    cache = Cache(config.state_dir / "cache", int(config.section("cache")["max_bytes"]))
    cache.put("ab" * 32, {"m0": artifact(tmp_path, "a", 300)}, {"source_job_id": "det-1", "target": "cubie",
                                                                 "model": "det.nb"})
    out = io.StringIO()
    assert command(config, "ls", out) == 0
    assert "abababababababab" in out.getvalue() and "det-1" in out.getvalue() and "1 entry, 300 of" in out.getvalue()
    assert cli.main(["cache", "clear", "-c", str(config_path)]) == 0
    assert cache.entries() == [] and not (config.state_dir / "cache" / ("ab" * 32)).exists()


def test_cache_clear_as_root_clears_an_entry_root_made(tmp_path: Path) -> None:
    """`sudo saigeedged compile` keeps its compile in the service's cache as root's; `saigeedged cache clear` run as
    root then acted as the service's user (the owner of state_dir), could not remove it, and said it was cleared.
    It runs as root (it makes no file, so it leaves nothing the daemon cannot write)."""
    import subprocess
    import sys

    from conftest import write_config

    config = write_config(tmp_path, cache={"max_bytes": 10_000})
    state = tmp_path / "state"
    cache = Cache(state / "cache", 10_000)
    assert cache.put("k1", {"m0": artifact(tmp_path, "a.nb", 500)}, {"source_job_id": "job-1"})  # root's
    for path in (state, state / "cache"):
        os.chown(path, 65534, 65534)  # the service's folders
    done = subprocess.run([sys.executable, "-m", "saigeedged", "cache", "clear", "-c", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "cleared 1 entry" in done.stdout, done
    assert cache.entries() == [] and list((state / "cache").iterdir()) == []  # its files too, not only its name

"""Every config problem (SPEC §2, §9) is one clear error line with a hint and exit 2: never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from saigeedged.cli import main as cli


def a_directory(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    return tmp_path / "etc"


def under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "saigeedged.yml").write_text("{}\n")
    return tmp_path / "saigeedged.yml" / "saigeedged.yml"


def a_socket(tmp_path: Path) -> Path:
    path = tmp_path / "c.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return path


def written(text: bytes) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        path = tmp_path / "c.yml"
        path.write_bytes(text)
        return path

    return make


# the manifest's ranges for what the config holds of a manifest (issue 25): a gate or a held-out count no manifest
# may carry would fail every job
RANGES = {
    "min_cosine 2": (b"accuracy: {min_cosine: 2}\n", "`accuracy.min_cosine` must be a number in [0, 1], got 2"),
    "min_cosine nan": (b"accuracy: {min_cosine: .nan}\n", "`accuracy.min_cosine` must be a number in [0, 1]"),
    "max_map_drop negative": (b"accuracy: {max_map_drop: -0.1}\n", "`accuracy.max_map_drop` must be a number in [0, 1]"),
    "eval_samples negative": (b"defaults: {eval_samples: -1}\n", "`defaults.eval_samples` must be >= 0, got -1"),
    "eval_samples huge": (b"defaults: {eval_samples: 99999999999}\n", "`defaults.eval_samples` is out of range"),
    # limits a negative or huge value of broke: the report's CPU bound (setrlimit raised, the job failed INTERNAL), a
    # job never tried, an engine call with no time at all
    "step_timeout_s negative": (b"limits: {step_timeout_s: -1}\n",
                                "`limits.step_timeout_s` must be between 1 and 31536000, got -1"),
    "step_timeout_s huge": (b"limits: {step_timeout_s: 9223372036854775808}\n",
                            "`limits.step_timeout_s` must be between 1 and 31536000"),
    "job_timeout_s 0": (b"limits: {job_timeout_s: 0}\n", "`limits.job_timeout_s` must be between 1 and 31536000, got 0"),
    "max_attempts 0": (b"limits: {max_attempts: 0}\n", "`limits.max_attempts` must be between 1 and 1000, got 0"),
    "engine_timeout_s nan": (b"limits: {engine_timeout_s: .nan}\n", "`limits.engine_timeout_s` must be between 0.1"),
    "publish_patience_s negative": (b"limits: {publish_patience_s: -5}\n",
                                    "`limits.publish_patience_s` must be between 0 and 31536000, got -5"),
    # every host job failed CHILD_LOST (RLIMIT_AS below what the child had mapped), retention said "0" of a negative
    "child_memory_bytes negative": (b"limits: {child_memory_bytes: -1}\n",
                                    f"`limits.child_memory_bytes` must be between {64 << 20} and"),
    "max_age_days negative": (b"retention: {max_age_days: -1}\n", "`retention.max_age_days` must be between 0 and"),
    "poll_interval_s 0": (b"watch: {poll_interval_s: 0}\n", "`watch.poll_interval_s` must be between 0.01 and"),
    "cache max_bytes negative": (b"cache: {max_bytes: -1}\n", "`cache.max_bytes` must be between 0 and"),
}
CASES: list[tuple[str, Callable[[Path], Path], str, str]] = [
    ("directory", a_directory, "INPUT_NOT_FOUND", "is a directory"),
    ("under a file", under_a_file, "INPUT_NOT_FOUND", "cannot read config"),
    ("socket", a_socket, "INPUT_NOT_FOUND", "cannot read config"),
    ("missing", lambda t: t / "nope.yml", "INPUT_NOT_FOUND", "not found"),
    ("binary", written(b"\xff\xfe\x00garbage"), "MANIFEST_INVALID", "not UTF-8"),
    ("bad yaml", written(b"inbox: [unclosed\n"), "MANIFEST_INVALID", "not valid YAML at line 2"),
    ("nul byte", written(b"inbox: a\x00b\n"), "MANIFEST_INVALID", "not valid YAML"),
    ("a list", written(b"- inbox\n"), "MANIFEST_INVALID", "must be a mapping"),
    ("nul in a path", written(b'allowed_roots: ["/data\\0x"]\n'), "MANIFEST_INVALID", "contains a NUL character"),
    ("unknown key", written(b"inbx: /x\n"), "MANIFEST_INVALID", "unknown key `inbx`"),
    ("float key given a string", written(b"limits: {engine_timeout_s: '9'}\n"), "MANIFEST_INVALID",
     "`limits.engine_timeout_s` must be a number, got '9'"),  # it said "must be int"
    ("control characters in a key", written(b'"a\\nb\\e[2J": 1\n'), "MANIFEST_INVALID",
     "unknown key `a\\nb\\x1b[2J`"),  # printed raw, the line broke in two
    # the manifest's YAML limits: int() of 5,000 digits and a 3,000-deep parse were tracebacks with exit 1
    ("huge number", written(b"accuracy: {min_cosine: " + b"1" * 5000 + b"}\n"), "MANIFEST_INVALID",
     "a number of 5000 characters at line 1"),
    ("deep nesting", written(b"accuracy: {min_cosine: " + b"[" * 3000 + b"]" * 3000 + b"}\n"), "MANIFEST_INVALID",
     "nested deeper than 32 levels"),
    # YAML takes a key given twice silently, the last one: the first `limits:` block was dropped without a word
    ("duplicate key", written(b"limits: {max_attempts: 5}\nwatch: {}\nlimits: {step_timeout_s: 60}\n"),
     "MANIFEST_INVALID", "the key `limits` is given twice (again at line 3)"),
    *[(label, written(text), "MANIFEST_INVALID", message) for label, (text, message) in RANGES.items()],
]


@pytest.mark.parametrize(("label", "make", "code", "text"), CASES, ids=[c[0] for c in CASES])
def test_config_problem_is_one_line_and_exit_2(tmp_path: Path, capsys: Any, label: str, make: Callable[[Path], Path],
                                               code: str, text: str) -> None:
    """run and check stop with the code, the file named, a hint, exit 2 (systemd then does not restart)."""
    path = make(tmp_path)
    for command in ("run", "check"):
        assert cli.main([command, "-c", str(path)]) == 2, command
        err = capsys.readouterr().err
        first, hint = err.splitlines()
        assert first.startswith(f"saigeedged: {code}: ") and text in first, err
        assert str(path) in first, err  # every error names the file (a key's said only `config:`)
        assert hint.startswith("  hint: "), err


def test_unreadable_config_from_the_real_command(tmp_path: Path) -> None:
    """The installed entry point given a directory as its config prints two lines, no traceback, exit 2."""
    run = subprocess.run([sys.executable, "-m", "saigeedged", "run", "-c", str(a_directory(tmp_path))],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.startswith(f"saigeedged: INPUT_NOT_FOUND: config {tmp_path / 'etc'} is a directory")
    assert "Traceback" not in run.stderr and len(run.stderr.splitlines()) == 2


@pytest.mark.parametrize(("keys", "text"), [
    ('metrics: {listen: "nohost:abc"}', "`metrics.listen` must be HOST:PORT or PORT, got 'nohost:abc'"),
    ('notify: [{url: "ftp://x"}]', "`notify[0].url` must be an http:// or https:// URL, got 'ftp://x'"),
], ids=["metrics.listen", "notify url"])
def test_check_refuses_the_ops_keys_run_refuses(tmp_path: Path, capsys: Any, keys: str, text: str) -> None:
    """The install flow is "edit the config, `check`, restart": a /metrics address or a notify URL the start-up refuses
    (exit 2) is refused by `check` too, in the same line (it said exit 0, and the service then did not start)."""
    path = tmp_path / "c.yml"
    path.write_text(f"inbox: {tmp_path / 'in'}\noutbox: {tmp_path / 'out'}\nstate_dir: {tmp_path / 'state'}\n{keys}\n")
    assert cli.main(["check", "-c", str(path)]) == 2
    first, hint = capsys.readouterr().err.splitlines()
    assert first == f"saigeedged: MANIFEST_INVALID: config {path}: {text}" and hint.startswith("  hint: ")  # which file

"""What a drop may not ask for (pure checks): outputs outside its own place, forged provenance, unprintable names."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

BUNDLE_SUFFIX = ".saigeedge"
RESERVED_DIRS = ("status", "logs")  # the daemon's own folders at the top of the outbox
PROVENANCE = ("schema_version", "build", "source", "encrypted")  # checkpoint.yaml fields only saigeedged writes
MAX_OUTPUT = 200  # bytes of `output:`; noclobber.unique_name adds 24 and a file name ends at 255
MAX_STEM = 120  # a job id adds 24 characters and a status file `.json` + a temp prefix/suffix: names stay < 255 bytes
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def output_problem(output: str) -> str | None:
    """Why a drop's `output:` is refused, or None: a plain `<name>.saigeedge` in the drop's own outbox folder.

    A folder in it could name another team's folder, `status/` or `logs/`; `.` or `..` would leave the outbox.
    """
    path = PurePosixPath(output)
    if "/" in output or "\\" in output or path.name != output:
        return "must be a file name in the drop's own outbox folder, without folders"
    if output.startswith(".") or not output.endswith(BUNDLE_SUFFIX) or output == BUNDLE_SUFFIX:
        return f"must be a visible file name ending in {BUNDLE_SUFFIX}"
    if printable(output) != output:
        return "must not contain control characters"
    if len(output.encode()) > MAX_OUTPUT:
        return f"must be at most {MAX_OUTPUT} bytes (a re-drop adds a time and a tag to it)"
    return None


def subdir_problem(subdir: str) -> str | None:
    """Why a drop's inbox folder cannot publish: it would land in the daemon's own `status/` or `logs/`."""
    top = subdir.split("/", 1)[0]
    if top in RESERVED_DIRS:
        return f"drops in the inbox folder `{top}/` would publish into the outbox's own `{top}/`: use another folder"
    return None


def overrides_problem(overrides: dict[str, Any]) -> str | None:
    """Why `runtime_overrides` is refused: it may tune the runtime, not rewrite where the bundle came from."""
    forged = [key for key in overrides if key in PROVENANCE]
    if forged:
        return f"must not set `{forged[0]}` (saigeedged records {', '.join(PROVENANCE)} itself)"
    return None


def printable(text: str) -> str:
    """`text` with control characters (terminal escapes, newlines) and undecodable bytes shown as escapes."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def short_stem(stem: str) -> str:
    """A stem short enough for job ids, status files and logs on every filesystem."""
    return stem[:MAX_STEM]


def headline(message: str) -> str:
    """A message in one line, for the places that show one (the journal, `status`'s table, a Slack text): its first
    line, and when that line only announces the lines after it (a step's `exited 1; last lines:`), their last one too,
    which is the compiler's own last word."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return printable(f"{lines[0]} ... {lines[-1]}")  # a compiler's colours: journalctl shows "[blob data]"
    return printable(lines[0]) if lines else ""

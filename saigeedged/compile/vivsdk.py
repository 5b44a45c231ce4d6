"""What the installed ACUITY image's VIV SDK supports: its `--optimize` targets against platforms and overrides in use.

Public vendor scripts disagree on whether the A733/T527 target strings carry `_PLUS_`; the image's
`<viv_sdk>/common/cfg/<TARGET>.config` files are the authority (SPEC §6, `saigeedged check`).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path

from saigeedged.jobs import QUEUED, RUNNING
from saigeedged.profiles import PLATFORMS

LIST_SCRIPT = "ls {cfg}/ 2>/dev/null | grep '\\.config$' || true"


def list_script(viv_sdk: str) -> str:
    """The fixed shell snippet that lists the target .config files (viv_sdk comes from the daemon config)."""
    return LIST_SCRIPT.format(cfg=shlex.quote(f"{viv_sdk}/common/cfg"))


def targets(listing: str) -> list[str]:
    """The `--optimize` target strings named by a listing of the cfg folder."""
    return sorted(name.removesuffix(".config") for name in listing.split() if name.endswith(".config"))


def missing(available: Iterable[str], overrides: Iterable[str]) -> list[str]:
    """One warning per platform target and per `optimize:` override in use that the image has no .config for."""
    have = set(available)
    out = []
    for platform, (target, _) in PLATFORMS.items():
        if target not in have:
            out.append(f"platform {platform}: --optimize {target} is not among the image's targets")
    for value in sorted(set(overrides) - have):
        out.append(f"optimize: {value} (a manifest override in the queue) is not among the image's targets")
    return out


def overrides_in_use(state_dir: Path) -> list[str]:
    """The `optimize:` values of the queued, running and recent cubie jobs (none when there is no queue yet)."""
    path = state_dir / "saigeedged.db"
    if not path.exists():
        return []
    from saigeedged.adapters.store import Store

    store = Store(path, verify=False)  # `check` beside a running daemon: no whole-file read
    try:
        jobs = store.in_state(QUEUED, RUNNING) + store.recent(100)
    finally:
        store.close()
    return sorted({str(j.entry["optimize"]) for j in jobs if j.target == "cubie" and j.entry.get("optimize")})

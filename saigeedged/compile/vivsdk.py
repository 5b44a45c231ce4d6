"""What the installed ACUITY image's VIV SDK supports: its `--optimize` targets, the one each platform gets, versions.

Public vendor scripts disagree on whether the A733/T527 target strings carry `_PLUS_`; the image's
`<viv_sdk>/common/cfg/<TARGET>.config` files are the authority (SPEC §6, `saigeedged check`, the cubie backend).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from saigeedged.jobs import QUEUED, RUNNING
from saigeedged.profiles import TARGET_CANDIDATES

LIST_SCRIPT = "ls {cfg}/ 2>/dev/null | grep '\\.config$' || true"
# the first candidate whose .config exists; exit 1 (nothing printed) when none does
CHOOSE_SCRIPT = 'for t in {names}; do [ -f {cfg}/"$t.config" ] && {{ echo "$t"; exit 0; }}; done; exit 1'
# one line: the ACUITY wheel folder (its name carries the version) and the VIV SDK folder with links resolved
# (VivanteIDE<ver> in its path); notes/pegasus.md "Wave 3 facts": read the versions from the image, never assume
VERSION_SCRIPT = 'printf "%s %s\\n" "$(ls -d /root/acuity-toolkit-whl-* 2>/dev/null | head -n 1)" ' \
                 '"$(readlink -f {sdk} 2>/dev/null || echo {sdk})"'
ACUITY_RE = re.compile(r"acuity-toolkit-whl-([0-9][0-9A-Za-z.+_-]*)")
IDE_RE = re.compile(r"VivanteIDE([0-9][0-9A-Za-z.+_-]*)")


def list_script(viv_sdk: str) -> str:
    """The fixed shell snippet that lists the target .config files (viv_sdk comes from the daemon config)."""
    return LIST_SCRIPT.format(cfg=shlex.quote(f"{viv_sdk}/common/cfg"))


def choose_script(viv_sdk: str, candidates: Sequence[str]) -> str:
    """The fixed snippet printing the first of `candidates` (profiles.TARGET_CANDIDATES) that has a .config."""
    return CHOOSE_SCRIPT.format(names=" ".join(shlex.quote(c) for c in candidates),
                                cfg=shlex.quote(f"{viv_sdk}/common/cfg"))


def version_script(viv_sdk: str) -> str:
    """The fixed snippet whose one line names the ACUITY wheel folder and the resolved VIV SDK folder."""
    return VERSION_SCRIPT.format(sdk=shlex.quote(viv_sdk))


def versions(text: str) -> dict[str, str | None]:
    """ACUITY and VivanteIDE versions from folder names (/root/acuity-toolkit-whl-6.30.22, VivanteIDE5.11.0)."""
    acuity, ide = ACUITY_RE.search(text), IDE_RE.search(text)
    return {"acuity": acuity.group(1) if acuity else None, "vivante_ide": ide.group(1) if ide else None}


def choose(platform: str, available: Iterable[str]) -> str | None:
    """The target a job of `platform` gets from an image with `available` targets: the first candidate it has."""
    have = set(available)
    return next((t for t in TARGET_CANDIDATES[platform] if t in have), None)


def targets(listing: str) -> list[str]:
    """The `--optimize` target strings named by a listing of the cfg folder."""
    return sorted(name.removesuffix(".config") for name in listing.split() if name.endswith(".config"))


def missing(available: Iterable[str], overrides: Iterable[str]) -> list[str]:
    """One warning per platform none of whose candidate targets the image has, and per `optimize:` override in
    use that the image has no .config for."""
    have = set(available)
    out = []
    for platform, candidates in TARGET_CANDIDATES.items():
        if choose(platform, have) is None:
            out.append(f"platform {platform}: --optimize {' or '.join(candidates)}: neither is among the image's "
                       f"targets ({platform} jobs fail CONTAINER_FAILED unless their manifest sets optimize:)"
                       if len(candidates) > 1 else
                       f"platform {platform}: --optimize {candidates[0]} is not among the image's targets")
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

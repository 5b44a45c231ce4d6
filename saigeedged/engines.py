"""The engine pool's config (SPEC §11). STUB of w11-surfaces until w11-pool's seam lands: replaced by theirs at merge."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saigeedged.config import Config
from saigeedged.errors import SaigeError

CONTAINER_TARGETS = ("cubie", "mobilint")


@dataclass(frozen=True)
class TLSFiles:
    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class EngineSpec:
    name: str
    url: str | None
    tls: TLSFiles | None
    targets: tuple[str, ...]

    @property
    def local(self) -> bool:
        return self.url is None or self.url.startswith("unix://")


def _spec(i: int, item: Any) -> EngineSpec:
    if not isinstance(item, dict) or not item.get("name"):
        raise SaigeError("MANIFEST_INVALID", f"config engines[{i}]: must be a mapping with a name")
    tls = item.get("tls")
    files = TLSFiles(Path(tls["ca"]), Path(tls["cert"]), Path(tls["key"])) if tls else None
    return EngineSpec(str(item["name"]), item.get("url"), files, tuple(item.get("targets") or CONTAINER_TARGETS))


def engine_specs(config: Config) -> list[EngineSpec]:
    """The configured engines; none listed = the local engine alone, serving every container target."""
    items = config.raw.get("engines") or []
    return [_spec(i, item) for i, item in enumerate(items)] or [EngineSpec("local", None, None, CONTAINER_TARGETS)]

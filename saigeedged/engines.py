"""The Docker engines of the config (SPEC §11): which engines compile which targets, validated at load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saigeedged.errors import SaigeError

CONTAINER_TARGETS = ("cubie", "mobilint")
SCHEMES = ("unix", "ssh", "tcp")
LOCAL = "local"  # the default engine's name: docker.from_env()'s engine (DOCKER_HOST or /var/run/docker.sock)
HINT = "see `engines:` in config/saigeedged.yml"


@dataclass(frozen=True)
class TLSFiles:
    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class EngineSpec:
    """One engine: `url` None is the local engine as docker.from_env() finds it."""

    name: str
    url: str | None
    tls: TLSFiles | None
    targets: tuple[str, ...]

    @property
    def local(self) -> bool:
        """Only a local engine shares the daemon's filesystem (bind-mounts the work root)."""
        return self.url is None or self.url.startswith("unix://")


DEFAULT = EngineSpec(LOCAL, None, None, CONTAINER_TARGETS)


def parse(items: list[Any], base: Path) -> list[EngineSpec]:
    """Validate the `engines:` items (unique names, a known scheme, tls only for tcp, container targets only)."""
    if not items:
        return [DEFAULT]
    specs = [_one(f"config engines[{i}]", item, base) for i, item in enumerate(items)]
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise SaigeError("MANIFEST_INVALID", f"config engines[{i}].name: {spec.name!r} is used twice", hint=HINT)
        seen.add(spec.name)
    return specs


def _one(where: str, item: Any, base: Path) -> EngineSpec:
    if not isinstance(item, dict):
        raise SaigeError("MANIFEST_INVALID", f"{where}: must be a mapping with name, url and targets", hint=HINT)
    unknown = sorted(set(item) - {"name", "url", "tls", "targets"})
    if unknown:
        raise SaigeError("MANIFEST_INVALID", f"{where}: unknown key `{unknown[0]}` (name, url, tls, targets)", hint=HINT)
    name = item.get("name")
    if not isinstance(name, str) or not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise SaigeError("MANIFEST_INVALID", f"{where}.name: must be a word of letters, digits, . _ -, got {name!r}",
                         hint=HINT)
    url = item.get("url")
    scheme = url.split("://", 1)[0] if isinstance(url, str) and "://" in url else None
    if scheme not in SCHEMES:
        raise SaigeError("MANIFEST_INVALID", f"{where}.url: must start with unix://, ssh:// or tcp://, got {url!r}",
                         hint=HINT)
    tls = _tls(where, item.get("tls"), base)
    if tls is not None and scheme != "tcp":
        raise SaigeError("MANIFEST_INVALID", f"{where}.tls: only a tcp:// engine takes tls, this one is {scheme}://",
                         hint=HINT)
    return EngineSpec(name, url, tls, _targets(where, item.get("targets", list(CONTAINER_TARGETS))))


def _tls(where: str, value: Any, base: Path) -> TLSFiles | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"ca", "cert", "key"} or \
            not all(isinstance(v, str) and v for v in value.values()):
        raise SaigeError("MANIFEST_INVALID", f"{where}.tls: must be a mapping of ca, cert and key file paths", hint=HINT)
    return TLSFiles(*(base / value[k] for k in ("ca", "cert", "key")))


def _targets(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise SaigeError("MANIFEST_INVALID", f"{where}.targets: must be a list of {', '.join(CONTAINER_TARGETS)}",
                         hint=HINT)
    for target in value:
        if target not in CONTAINER_TARGETS:
            raise SaigeError("MANIFEST_INVALID", f"{where}.targets: {target!r} is not a container target "
                             f"({', '.join(CONTAINER_TARGETS)}; host jobs run on the daemon's host)", hint=HINT)
    return tuple(dict.fromkeys(value))

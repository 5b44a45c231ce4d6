"""The Docker engines of the config (SPEC §11): which local engines compile which targets, validated at load.

More than one compile host is `executor: slurm` (docs/spec-executor-slurm.md): the home-made pool of remote engines
over ssh or tcp+TLS is retired, and such an engine is refused at load with a pointer there."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from saigeedged.errors import SaigeError

CONTAINER_TARGETS = ("cubie", "mobilint")
TARGETS = (*CONTAINER_TARGETS, "host")  # every target a manifest may name (SPEC §3)
SCHEMES = ("unix",)
RETIRED = ("ssh", "tcp")  # remote engines: scale-out runs on Slurm now
LOCAL = "local"  # the default engine's name: DOCKER_HOST's unix socket, else dockerd's own (local_url)
SOCKET = "unix:///var/run/docker.sock"
HINT = "see `engines:` in /usr/share/doc/saigeedged/examples/saigeedged.yml (config/saigeedged.yml in the source)"
SLURM_HINT = "more compile hosts are the nodes of a Slurm partition: docs/spec-executor-slurm.md, README 'Add a compile host'"


@dataclass(frozen=True)
class EngineSpec:
    """One engine: `url` None is the local engine (local_url)."""

    name: str
    url: str | None
    targets: tuple[str, ...]


DEFAULT = EngineSpec(LOCAL, None, CONTAINER_TARGETS)


def local_url() -> str:
    """The local engine's socket: DOCKER_HOST's when it names one, else dockerd's. Never a remote engine nor the Docker
    CLI's current context, which docker-py's from_env() would follow: the default engine could silently be another
    host's (root there over ssh or TCP, the pool issue 27 retired). DOCKER_UNAVAILABLE naming DOCKER_HOST otherwise."""
    host = os.environ.get("DOCKER_HOST") or SOCKET
    if not host.startswith("unix://"):
        raise SaigeError("DOCKER_UNAVAILABLE", f"DOCKER_HOST={host!r} names a remote engine: saigeedged compiles on "
                         "this host's own engine (a unix:// socket) only", hint="unset DOCKER_HOST in the service's "
                         "environment (systemctl show saigeedged -p Environment); " + SLURM_HINT)
    return host


def parse(items: list[Any]) -> list[EngineSpec]:
    """Validate the `engines:` items (unique names, unix:// only, container targets only)."""
    if not items:
        return [DEFAULT]
    specs = [_one(f"config: engines[{i}]", item) for i, item in enumerate(items)]
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise SaigeError("MANIFEST_INVALID", f"config: engines[{i}].name: {spec.name!r} is used twice", hint=HINT)
        seen.add(spec.name)
    return specs


def _one(where: str, item: Any) -> EngineSpec:
    if not isinstance(item, dict):
        raise SaigeError("MANIFEST_INVALID", f"{where}: must be a mapping with name, url and targets", hint=HINT)
    unknown = sorted(set(item) - {"name", "url", "targets"})
    if unknown:
        raise SaigeError("MANIFEST_INVALID", f"{where}: unknown key `{unknown[0]}` (name, url, targets)",
                         hint=SLURM_HINT if unknown[0] == "tls" else HINT)
    name = item.get("name")
    if not isinstance(name, str) or not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise SaigeError("MANIFEST_INVALID", f"{where}.name: must be a word of letters, digits, . _ -, got {name!r}",
                         hint=HINT)
    url = item.get("url")
    scheme = url.split("://", 1)[0] if isinstance(url, str) and "://" in url else None
    if scheme in RETIRED:
        raise SaigeError("MANIFEST_INVALID", f"{where}.url: remote engines ({scheme}://) are retired: run more compile "
                         f"hosts as a Slurm partition with `executor: slurm`, got {url!r}", hint=SLURM_HINT)
    if scheme not in SCHEMES:
        raise SaigeError("MANIFEST_INVALID", f"{where}.url: must start with unix://, got {url!r}", hint=HINT)
    return EngineSpec(name, url, _targets(where, item.get("targets", list(CONTAINER_TARGETS))))


def _targets(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise SaigeError("MANIFEST_INVALID", f"{where}.targets: must be a list of {', '.join(CONTAINER_TARGETS)}",
                         hint=HINT)
    for target in value:
        if target not in CONTAINER_TARGETS:
            raise SaigeError("MANIFEST_INVALID", f"{where}.targets: {target!r} is not a container target "
                             f"({', '.join(CONTAINER_TARGETS)}; host jobs run on the daemon's host)", hint=HINT)
    return tuple(dict.fromkeys(value))

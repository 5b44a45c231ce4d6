"""`saigeedged check` for the `engines:` of the config (SPEC §11: local engines): one line per engine, saying what
it lacks. Each engine is probed for: an answer (or why not: refused, timed out), the image of each target it serves,
pegasus (cubie) or qbcompiler (mobilint) inside that image, and the runtime compiles use.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests

from saigeedged.adapters.docker import connect, pick_runtime
from saigeedged.adapters.docker.api import ContainerError, ImageNotFound
from saigeedged.compile import vivsdk
from saigeedged.compile.backends import cubie, mobilint
from saigeedged.config import Config
from saigeedged.engines import EngineSpec

CHECK_TIMEOUT_S = 15.0  # a check must not sit out the daemon's long engine timeout on each hung engine
MOBILINT_PROBE = mobilint.PROBE
TOOLS = {"cubie": ("pegasus", cubie.PROBE), "mobilint": ("qbcompiler", MOBILINT_PROBE)}
LOAD_HINT = {"cubie": "docker load -i ubuntu-npu_v2.0.10.1.tar on that host",
             "mobilint": "docker load the qbcompiler image on that host"}


@dataclass
class Probe:
    """What one engine answered; `lacks` lists what stops a slot there (`fatal`: a FAIL, else a warning)."""

    name: str
    reached: str = ""  # "server 27.1.1, runtime runc" when it answered
    found: list[str] = field(default_factory=list)
    lacks: list[str] = field(default_factory=list)
    fatal: bool = False
    viv: tuple[str, ...] | None = None  # the --optimize targets of the cubie image's VIV SDK, once probed
    versions: list[str] = field(default_factory=list)  # "ACUITY 6.30.22, VivanteIDE 5.11.0", "qb Compiler 1.3.0"

    def lack(self, what: str, fatal: bool = True) -> None:
        self.lacks.append(what)
        self.fatal |= fatal

    def line(self) -> str:
        if not self.reached:
            return f"{self.name}: unreachable: {'; '.join(self.lacks)}"
        text = f"{self.name}: reachable, {self.reached}; {'; '.join(self.found) or 'no targets'}"
        return text + (f"; lacks {'; '.join(self.lacks)}" if self.lacks else "")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return seen


def unreachable_reason(exc: BaseException, timeout_s: float) -> str:
    """Why an engine did not answer, in the operator's words (docker-py wraps the cause; look along the chain)."""
    chain = _chain(exc)
    text = " ".join(str(e) for e in chain)
    if any(isinstance(e, requests.exceptions.Timeout | socket.timeout | TimeoutError) for e in chain) \
            or "timed out" in text.lower():
        return f"timed out after {timeout_s:g} s (dockerd hung)"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "refused" in text.lower():
        return "connection refused (dockerd not running, or a stale socket)"
    return f"{type(chain[-1]).__name__}: {str(chain[-1])[:200]}"


def run_probe(api: Any, image: str, script: str) -> str:
    """Run a fixed snippet in a throwaway container of `image` (never the long-lived one); its output. Every call has
    the client's deadline: `containers.run` waits with none (docker-py passes wait(timeout=None) and follows the logs
    on a socket without one), so a hung dockerd or a probe that never ends held `check` for ever."""
    command = ["sh", "-c", script]
    ctr = api.containers.create(image, command)
    try:
        ctr.start()
        status = ctr.wait(timeout=api.api.timeout)["StatusCode"]
        out = ctr.logs(stdout=True, stderr=True)
        if status != 0:  # as containers.run: a probe that fails raises, its output is never taken for an answer
            raise ContainerError(ctr, status, command, image, ctr.logs(stdout=False, stderr=True))
    finally:
        ctr.remove(force=True)
    return bytes(out).decode(errors="replace").strip()


def _runtime(probe: Probe, config: Config, info: dict[str, Any]) -> None:
    runtimes = info.get("Runtimes", {})
    chosen = pick_runtime(config.cubie.runtime, info) or info.get("DefaultRuntime", "?")
    probe.reached = f"server {info.get('ServerVersion', '?')}, runtime {chosen}"
    if runtimes and chosen not in runtimes:
        probe.lack(f"runtime {chosen} (it has {', '.join(runtimes)})")


def _target(probe: Probe, api: Any, config: Config, target: str) -> None:
    """The target's image on this engine and its compiler inside (probed in a throwaway container)."""
    image = (config.cubie if target == "cubie" else config.mobilint).image
    tool, script = TOOLS[target]
    try:
        api.images.get(image)
    except ImageNotFound:
        probe.lack(f"{target} image {image} ({LOAD_HINT[target]})", fatal=target == "cubie")
        return
    configured = config.cubie.pegasus if target == "cubie" else "auto"
    entry = configured if configured != "auto" else run_probe(api, image, script)
    if not entry:
        probe.lack(f"{tool} in {target} image {image}")
        return
    probe.found.append(f"{target} {image} ({tool} {entry.splitlines()[-1]})")
    if target == "cubie":
        probe.viv = tuple(vivsdk.targets(run_probe(api, image, vivsdk.list_script(config.cubie.viv_sdk))))
        found = vivsdk.versions(run_probe(api, image, vivsdk.version_script(config.cubie.viv_sdk)) + " " + entry)
        probe.versions.append(f"ACUITY {found['acuity'] or 'unknown'}, VivanteIDE {found['vivante_ide'] or 'unknown'}")
    else:
        version = mobilint.VERSION.search(run_probe(api, image, mobilint.VERSION_PROBE))
        probe.versions.append(f"qb Compiler {version.group(1) if version else 'unknown'}")


def probe_engine(config: Config, spec: EngineSpec, timeout_s: float,
                 connector: Callable[[EngineSpec, float], Any] = connect) -> Probe:
    """Everything `check` says about one engine; never raises for an engine that cannot be reached."""
    probe = Probe(spec.name)
    try:
        api = connector(spec, timeout_s)
        api.ping()
        info = api.info()
    except Exception as exc:  # any way of not answering is this engine's line, not a crash of check
        probe.lack(unreachable_reason(exc, timeout_s))
        return probe
    try:
        _runtime(probe, config, info)
        for target in spec.targets:
            _target(probe, api, config, target)
    except Exception as exc:  # it answered, then stopped answering mid-probe
        probe.lack(f"stopped answering: {unreachable_reason(exc, timeout_s)}")
    finally:
        api.close()
    return probe


def probe_all(config: Config) -> list[Probe]:
    """Every configured engine, probed side by side (a hung one costs one timeout, not one per engine)."""
    specs = list(config.engines)
    timeout_s = min(config.limits.engine_timeout_s, CHECK_TIMEOUT_S)
    with ThreadPoolExecutor(max_workers=min(8, len(specs))) as pool:
        return list(pool.map(lambda spec: probe_engine(config, spec, timeout_s), specs))

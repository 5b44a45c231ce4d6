"""`saigeedged check`: is this host ready to compile? Docker, images, runtime, containers, dirs, journald, inotify."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TextIO

from saigeedged.adapters import journal
from saigeedged.adapters.docker import MANAGED_LABEL, DockerAPI, Spec, connect
from saigeedged.adapters.docker.api import ENGINE_ERRORS, ImageNotFound, NotFound
from saigeedged.adapters.slurm import leftout
from saigeedged.adapters.slurm.cluster import Slurm, images
from saigeedged.adapters.store import Store
from saigeedged.cli import partition
from saigeedged.cli.engineprobe import MOBILINT_PROBE, probe_all, run_probe, unreachable_reason
from saigeedged.cli.enginestatus import pool_configured
from saigeedged.compile import vivsdk
from saigeedged.compile.backends import cubie, mobilint
from saigeedged.config import DEFAULTS, Config
from saigeedged.engines import CONTAINER_TARGETS, DEFAULT
from saigeedged.errors import SaigeError
from saigeedged.executor import capacity, feature
from saigeedged.profiles import TARGET_CANDIDATES
from saigeedged.service import ops

OK, WARN, FAIL = "ok", "warn", "FAIL"
LOAD = {"cubie": "docker load -i ubuntu-npu_v2.0.10.1.tar, then check the tag",
        "mobilint": "docker load the qb Compiler image Mobilint ships, then check the tag"}


class Report:
    """Collects check lines; any FAIL makes the exit code 3."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.failed = False

    def __call__(self, level: str, what: str, text: str) -> None:
        self.failed |= level == FAIL
        print(f"{level:<5} {what:<12} {text}", file=self.out)


def _container(report: Report, api: DockerAPI, spec: Spec) -> None:
    try:
        ctr = api.containers.get(spec.name)
    except NotFound:
        report(OK, "container", f"{spec.name}: absent (created on the first job)")
        return
    mounted = any(m.get("Destination") == str(spec.work_root) for m in ctr.attrs.get("Mounts", []))
    managed = ctr.labels.get(MANAGED_LABEL) == "1"
    level = OK if mounted or managed else FAIL
    report(level, "container", f"{spec.name}: {ctr.status}, work root {'mounted' if mounted else 'NOT mounted'}, "
           f"{'managed by saigeedged' if managed else 'not created by saigeedged'}")


def _waiting(state_dir: Path) -> dict[str, int]:
    """Queued and running jobs per target (none when there is no queue yet)."""
    path = state_dir / "saigeedged.db"
    if not path.exists():
        return {}
    store = Store(path, verify=False)  # `check` beside a running daemon: no whole-file read
    try:
        return store.waiting_by_target()
    finally:
        store.close()


def _needed(config: Config, target: str, image: str) -> str | None:
    """Why `target`'s image must be loaded now, or None: the shipped tag of an image yet to be loaded, which no job
    waits for, leaves the host ready for what it can do (`host`; SPEC §16)."""
    if image != DEFAULTS[target]["image"]:
        return "the config names it"
    jobs = _waiting(config.state_dir).get(target, 0)
    return f"{jobs} queued or running {target} job{'s' * (jobs > 1)} need it" if jobs else None


def _image(report: Report, api: DockerAPI, spec: Spec, target: str, config: Config) -> bool:
    """Report the target's image and, when it is loaded, its container; False when the image is missing."""
    try:
        api.images.get(spec.image)
    except ImageNotFound:
        why = _needed(config, target, spec.image)
        until = f"until then {target} jobs fail IMAGE_NOT_FOUND; host jobs compile"
        report(FAIL if why else WARN, "image", f"{target} {spec.image} not loaded: {LOAD[target]} ({why or until})")
        return False
    report(OK, "image", f"{target} {spec.image}")
    _container(report, api, spec)
    return True


def _cubie(report: Report, api: DockerAPI, config: Config) -> None:
    section = config.cubie
    spec = Spec.for_target(config, "cubie")
    if not _image(report, api, spec, "cubie", config):
        return
    entry = section.pegasus if section.pegasus != "auto" else run_probe(api, spec.image, cubie.PROBE)
    report(OK if entry else FAIL, "pegasus", entry.splitlines()[0] if entry else "no pegasus on PATH nor pegasus.py in the image")
    found = vivsdk.versions(run_probe(api, spec.image, vivsdk.version_script(section.viv_sdk)) + " " + entry)
    report(OK if all(found.values()) else WARN, "versions",
           f"ACUITY {found['acuity'] or 'unknown'}, VivanteIDE {found['vivante_ide'] or 'unknown'}")
    _viv_sdk(report, config, vivsdk.targets(run_probe(api, spec.image, vivsdk.list_script(section.viv_sdk))))


def _viv_sdk(report: Report, config: Config, configs: list[str], where: str = "") -> None:
    """The --optimize targets the image's VIV SDK has, the one each platform gets, and the platforms or queued
    overrides it lacks."""
    report(OK if configs else FAIL, "viv_sdk", f"{config.cubie.viv_sdk}: --optimize targets "
           f"{', '.join(configs) or 'none (no target .config files)'}{where}")
    chosen = {platform: vivsdk.choose(platform, configs) for platform in TARGET_CANDIDATES}
    if any(chosen.values()):
        report(OK, "optimize", ", ".join(f"{p} -> {t}" for p, t in chosen.items() if t) + where)
    for warning in vivsdk.missing(configs, vivsdk.overrides_in_use(config.state_dir)) if configs else []:
        report(WARN, "optimize", warning)


def _mobilint(report: Report, api: DockerAPI, config: Config) -> None:
    spec = Spec.for_target(config, "mobilint")
    if not _image(report, api, spec, "mobilint", config):
        return
    entry = run_probe(api, spec.image, MOBILINT_PROBE)
    report(OK if entry else FAIL, "qbcompiler", entry.splitlines()[-1] if entry else "no qbcompiler in the image")
    if not entry:
        return
    version = mobilint.VERSION.search(run_probe(api, spec.image, mobilint.VERSION_PROBE))
    report(OK if version else WARN, "versions", f"qb Compiler {version.group(1) if version else 'unknown'}")
    device = mobilint.compile_device(config.mobilint.device, spec.image)
    report(OK, "device", f"qbcompiler --device {device} (mobilint.device {config.mobilint.device}), "
           f"{mobilint.PARSER_WORKERS_ENV}={mobilint.parser_workers(config.limits.mobilint_parser_workers)}")


def _docker(report: Report, config: Config) -> None:
    try:
        api = connect(DEFAULT)
    except SaigeError as exc:
        report(FAIL, "docker", f"{exc.message} ({exc.hint})")
        return
    try:
        _answered(report, api, config)
    except ENGINE_ERRORS as exc:  # it answered the connect, then not a call: one FAIL line, never a traceback
        report(FAIL, "docker", unreachable_reason(exc, api.api.timeout))


def _answered(report: Report, api: DockerAPI, config: Config) -> None:
    info = api.info()
    default = info.get("DefaultRuntime", "?")
    runtime = config.cubie.runtime
    level = WARN if default == "nvidia" and runtime == "auto" else OK
    report(OK, "docker", f"reachable, server {info.get('ServerVersion', '?')}")
    report(level, "runtime", f"default {default}, available {', '.join(info.get('Runtimes', {}))}"
           + (" (runc is used for compiles)" if level == WARN else ""))
    _cubie(report, api, config)
    _mobilint(report, api, config)


def _host(report: Report, config: Config) -> None:
    dirs = [("inbox", config.inbox), ("outbox", config.outbox)] if config.named_dirs else []
    for label, path in dirs + [("state_dir", config.state_dir)]:
        probe = next(p for p in (path, *path.parents) if p.exists())
        writable = os.access(probe, os.W_OK)
        report(OK if writable else FAIL, label, f"{path} {'exists' if path.exists() else 'will be created'}"
               + ("" if writable else ", NOT writable"))
    journal_error = journal.journal_unreachable()
    report(WARN if journal_error else OK, "journald",
           f"not reachable ({journal_error}): events go to stderr" if journal_error else "accepting events")
    watches = Path("/proc/sys/fs/inotify/max_user_watches")
    report(OK, "inotify", f"max_user_watches {watches.read_text().strip()}" if watches.exists() else "unavailable: poll mode")


def _engines(report: Report, config: Config) -> None:
    """An engine pool: one line per engine, what it answered and what it lacks (SPEC §11)."""
    probes = probe_all(config)
    for probe in probes:
        report(FAIL if probe.fatal else WARN if probe.lacks else OK, "engine", probe.line())
    sdks: dict[tuple[str, ...], list[str]] = {}  # one viv_sdk line per distinct SDK, naming the engines that have it
    for probe in probes:
        if probe.viv is not None:
            sdks.setdefault(probe.viv, []).append(probe.name)
    for configs, names in sdks.items():
        _viv_sdk(report, config, list(configs), f" (engine {', '.join(names)})")
    tools: dict[str, list[str]] = {}  # one line per distinct toolchain version, naming the engines that have it
    for probe in probes:
        for text in probe.versions:
            tools.setdefault(text, []).append(probe.name)
    for text, names in tools.items():
        report(OK, "versions", f"{text} (engine {', '.join(names)})")


def _partition(report: Report, config: Config) -> None:
    """executor slurm: a line per node of the partition; a target no up node serves is a failure (its jobs wait)."""
    try:
        nodes = Slurm(config.executor).nodes(fresh=True)
    except SaigeError as exc:
        report(FAIL, "slurm", f"{exc.message} ({exc.hint})")
        return
    wanted = images(config)
    report(OK, "slurm", f"partition {config.executor.partition}: {len(nodes)} nodes, work share {config.work_root}")
    left = leftout.current(config.state_dir, time.time())
    for node in nodes:
        line = partition.node_line(node, wanted, left)
        report(OK if node.up and "lacks" not in line and "left out" not in line else WARN, "node", line)
    for target in CONTAINER_TARGETS:
        if capacity(nodes, target, wanted[target]) == 0:
            report(FAIL, target, f"no up node of partition {config.executor.partition} has Gres={target}:1 and "
                   f"Feature={feature(wanted[target])}")


def main(config: Config, out: TextIO | None = None) -> int:
    ops.surfaces(config)  # what `run` refuses at start-up (exit 2), before anything is looked at
    report = Report(out or sys.stdout)
    if config.executor.slurm:  # container steps run on the partition's nodes, through their own engines
        _partition(report, config)
    elif pool_configured(config):
        _engines(report, config)
    else:
        _docker(report, config)
    _host(report, config)
    return 3 if report.failed else 0

"""Daemon configuration (SPEC §2): defaults, loading, validation of every key, typed sections built once at load.

The SAIGE_CUBIE_<KEY> environment overrides of the guide are applied here, at load, and nowhere else.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from saigeedged import guards, manifest, safeyaml
from saigeedged.engines import EngineSpec
from saigeedged.engines import parse as parse_engines
from saigeedged.errors import SaigeError
from saigeedged.executor import ExecutorSpec
from saigeedged.executor import parse as parse_executor

DEFAULT_PATH = Path("/etc/saigeedged/saigeedged.yml")
# a config error's hint: where every key is documented on a host the package installed, and in the source tree
DOCUMENTED = ("every key and its default are documented in /usr/share/doc/saigeedged/examples/saigeedged.yml "
              "(config/saigeedged.yml in the source)")

# Every key with its default; the types of these values are the accepted types.
DEFAULTS: dict[str, Any] = {
    "inbox": "/srv/saige/inbox",
    "outbox": "/srv/saige/outbox",
    "state_dir": "/var/lib/saigeedged",
    "allowed_roots": [],
    "watch": {
        "mode": "auto",
        "poll_interval_s": 5.0,
        "rescan_interval_s": 60.0,
        "settle_s": 2.0,
        "orphan_timeout_s": 600.0,
    },
    "cubie": {
        "container": "saige-cubie",
        "image": "ubuntu-npu:v2.0.10.1",
        "runtime": "auto",
        "user": "auto",
        "pegasus": "auto",
        "viv_sdk": "/root/Vivante_IDE/VivanteIDE5.11.0/cmdtools",
    },
    "mobilint": {
        "container": "saige-mobilint",
        "image": "mobilint/qbcompiler:1.3-cpu-ubuntu22.04",
        "device": "auto",
    },
    "limits": {
        "step_timeout_s": 3600,
        "job_timeout_s": 14400,
        "max_attempts": 3,
        "max_onnx_bytes": 8589934592,
        "child_memory_bytes": 25769803776,
        "publish_patience_s": 3600.0,
        "engine_timeout_s": 120.0,
        "prepare_ahead": True,
        "mobilint_parser_workers": 0,
    },
    "defaults": {
        "target": "cubie",
        "calibration_method": "ema",
        "n_samples": 100,
        "seed": 1337,
        "eval_samples": 16,  # held-out images of the accuracy report (SPEC §17)
    },
    # the accuracy gate (SPEC §17), on means over the held-out images: a compile below it ends failed ACCURACY_GATE and
    # is never published
    "accuracy": {"min_cosine": 0.95, "max_map_drop": 0.1},
    "cache": {"max_bytes": 10 * 1024**3},  # compiled artifacts under <state_dir>/cache/ (SPEC §12); 0 turns it off
    "keep_work": False,
    "log": {"format": "auto", "level": "info"},
    # ops surfaces (SPEC §13): each is off by default
    "metrics": {"listen": "", "textfile": ""},
    "notify": [],  # a list key, like the engine pool's `engines:` (SPEC §11)
    "retention": {"max_age_days": 0.0, "keep_last_per_name": 0, "keep_rows_days": 0.0},
    "dashboard": False,
    "engines": [],  # Docker engines (SPEC §11); empty: the one local engine (saigeedged/engines.py validates items)
    # where container steps run: `local` (this host's engine) or `slurm` (docs/spec-executor-slurm.md; executor.py)
    "executor": {"kind": "local", "partition": "", "work_share": "", "fast_requeue": True, "max_jobs": 16,
                 "poll_interval_s": 2.0},
}

CHOICES: dict[str, tuple[str, ...]] = {
    "watch.mode": ("auto", "events", "poll"),
    "log.format": ("auto", "journal", "json", "console"),
    "log.level": ("debug", "info", "warning", "error"),
    "defaults.target": ("cubie", "mobilint", "host"),
    "mobilint.device": ("auto", "cpu", "gpu"),
    "defaults.calibration_method": ("ema", "minmax", "kl", "normal", "auto"),
}
YEAR_S = 365 * 24 * 3600
# (least, most) of numeric keys whose values outside would break what uses them (a negative timeout, a CPU bound
# past what setrlimit takes, a job never tried)
RANGES: dict[str, tuple[int | float, int | float]] = {
    "watch.poll_interval_s": (0.01, 24 * 3600),
    "watch.rescan_interval_s": (0.01, 24 * 3600),
    "watch.settle_s": (0, 24 * 3600),
    "watch.orphan_timeout_s": (0, YEAR_S),
    "limits.step_timeout_s": (1, YEAR_S),
    "limits.job_timeout_s": (1, YEAR_S),
    "limits.max_attempts": (1, 1000),
    "limits.max_onnx_bytes": (1, 1 << 50),
    "limits.child_memory_bytes": (64 << 20, 1 << 50),  # below: the child cannot even start its thread's data
    "limits.publish_patience_s": (0, YEAR_S),
    "limits.engine_timeout_s": (0.1, 24 * 3600),
    "limits.mobilint_parser_workers": (0, 1024),
    "cache.max_bytes": (0, 1 << 60),
    "retention.max_age_days": (0, 36500),
    "retention.keep_last_per_name": (0, 1 << 20),
    "retention.keep_rows_days": (0, 36500),
}


ENV_PREFIX = "SAIGE_CUBIE_"  # the guide's overrides: SAIGE_CUBIE_<KEY> for each cubie key, SAIGE_CUBIE_KEEP_WORK=1


@dataclass(frozen=True)
class Watch:
    mode: str
    poll_interval_s: float
    rescan_interval_s: float
    settle_s: float
    orphan_timeout_s: float


@dataclass(frozen=True)
class Target:
    """A container target's section: its container's name and image (mobilint's whole section)."""

    container: str
    image: str


@dataclass(frozen=True)
class Cubie(Target):
    """The cubie section, with the SAIGE_CUBIE_<KEY> overrides applied."""

    runtime: str
    user: str
    pegasus: str
    viv_sdk: str


@dataclass(frozen=True)
class Mobilint(Target):
    """The mobilint section: `device` is where qbcompiler computes (auto: cpu for a `-cpu-` image tag)."""

    device: str


@dataclass(frozen=True)
class Limits:
    step_timeout_s: int
    job_timeout_s: int
    max_attempts: int
    max_onnx_bytes: int
    child_memory_bytes: int
    publish_patience_s: float
    engine_timeout_s: float
    prepare_ahead: bool
    mobilint_parser_workers: int  # MBLT_HL_PARSER_NUM_WORK; 0: the host's CPUs minus one


@dataclass(frozen=True)
class Defaults:
    """What a manifest entry leaves out."""

    target: str
    calibration_method: str
    n_samples: int
    seed: int
    eval_samples: int = 16

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Accuracy:
    """The gate (SPEC §17): no output's cosine, nor a detector's decoded-score correlation, averaged over the held-out
    images, may fall below `min_cosine`, nor the compiled model's mAP@0.5 below the float model's by more than
    `max_map_drop` (where it is measured); a manifest's `accuracy:` wins. The defaults are measured (bench/gate.py):
    ordinary uint8 quantization stays >= 0.96, a collapsed score head falls to <= 0.93."""

    min_cosine: float = 0.95
    max_map_drop: float = 0.1


@dataclass(frozen=True)
class Cache:
    max_bytes: int


@dataclass(frozen=True)
class Log:
    format: str
    level: str


@dataclass(frozen=True)
class Metrics:
    listen: str
    textfile: str


@dataclass(frozen=True)
class Retention:
    max_age_days: float
    keep_last_per_name: int
    keep_rows_days: float  # 0: the rows of pruned jobs stay (status answers for every job ever run)


@dataclass(frozen=True)
class Config:
    """The resolved daemon configuration: typed sections; `raw` keeps every section as loaded (overrides applied)."""

    inbox: Path
    outbox: Path
    state_dir: Path
    allowed_roots: tuple[Path, ...]
    watch: Watch
    cubie: Cubie
    mobilint: Mobilint
    limits: Limits
    defaults: Defaults
    cache: Cache
    log: Log
    metrics: Metrics
    notify: tuple[Any, ...]  # webhooks.channels validates each
    retention: Retention
    dashboard: bool
    keep_work: bool
    engines: tuple[EngineSpec, ...]  # at least one: without `engines:` the local engine (SPEC §11)
    raw: dict[str, Any] = field(repr=False)
    source: Path | None = None
    named_dirs: bool = False
    accuracy: Accuracy = Accuracy()
    executor: ExecutorSpec = ExecutorSpec()

    def section(self, name: str) -> dict[str, Any]:
        """Deprecated: read the typed sections (`config.limits.max_attempts`); kept until the last callers move."""
        value: dict[str, Any] = self.raw[name]
        return value

    @property
    def work_root(self) -> Path:
        """Attempts' work dirs: under state_dir, or on the share every compile host mounts (executor slurm)."""
        return self.executor.work_share or self.state_dir / "work"


def _merge(user: Any, defaults: dict[str, Any], prefix: str) -> dict[str, Any]:
    if not isinstance(user, dict):
        where = prefix.rstrip(".") or "the config"
        raise SaigeError("MANIFEST_INVALID", f"config: {where} must be a mapping", hint=DOCUMENTED)
    merged = dict(defaults)
    for key, value in user.items():
        name = f"{prefix}{guards.printable(str(key)[:80])}"  # a key is echoed: one line, no terminal control
        if key not in defaults:
            near = difflib.get_close_matches(str(key), list(defaults), n=1)
            tip = f" (did you mean `{prefix}{near[0]}`?)" if near else ""
            raise SaigeError("MANIFEST_INVALID", f"config: unknown key `{name}`{tip}",
                             hint=DOCUMENTED)
        default = defaults[key]
        if isinstance(default, dict):
            merged[key] = _merge(value, default, f"{name}.")
        else:
            merged[key] = _check_type(name, value, default)
    return merged


def _check_type(name: str, value: Any, default: Any) -> Any:
    expected: tuple[type, ...] = (int, float) if isinstance(default, float) else (type(default),)
    ok = isinstance(value, expected) and not (isinstance(value, bool) and not isinstance(default, bool))
    if not ok:
        kind = "a number" if isinstance(default, float) else expected[0].__name__  # a float key takes an int too
        raise SaigeError("MANIFEST_INVALID", f"config: `{name}` must be {kind}, got {safeyaml.shown(value)}",
                         hint=DOCUMENTED)
    if name in RANGES and not RANGES[name][0] <= value <= RANGES[name][1]:
        least, most = RANGES[name]
        raise SaigeError("MANIFEST_INVALID", f"config: `{name}` must be between {least} and {most}, "
                         f"got {safeyaml.shown(value)}", hint=DOCUMENTED)
    if name in CHOICES and value not in CHOICES[name]:
        raise SaigeError("MANIFEST_INVALID", f"config: `{name}` must be one of {', '.join(CHOICES[name])}, "
                         f"got {safeyaml.shown(value)}",
                         hint=DOCUMENTED)
    return value


def _manifest_values(raw: Mapping[str, Any]) -> None:
    """`defaults:` and `accuracy:` hold manifest values: one the manifest refuses is refused here, at start-up, by the
    manifest's own rule (ranges included), instead of failing every job that inherits it."""
    fields = [(f"defaults.{key}", key, value) for key, value in raw["defaults"].items()]
    for name, key, value in [*fields, ("accuracy", "accuracy", raw["accuracy"])]:
        found = manifest.problem(key, value)
        if found is not None:
            raise SaigeError("MANIFEST_INVALID", f"config: {found.replace(f'`{key}`', f'`{name}`', 1)}",
                             hint=DOCUMENTED)


def from_dict(user: dict[str, Any], base: Path, source: Path | None = None) -> Config:
    """Validate `user` against DEFAULTS; relative paths are resolved against `base`."""
    raw = _merge(user, DEFAULTS, "")
    _manifest_values(raw)
    raw["cubie"] = {key: os.environ.get(f"{ENV_PREFIX}{key.upper()}") or value for key, value in raw["cubie"].items()}

    def path(value: str) -> Path:
        if "\0" in value:  # YAML's "\0" escape: the OS takes no such path
            raise SaigeError("MANIFEST_INVALID", f"config: path {value!r} contains a NUL character",
                             hint=DOCUMENTED)
        return (base / os.path.expanduser(value)).resolve()

    return Config(
        inbox=path(raw["inbox"]),
        outbox=path(raw["outbox"]),
        state_dir=path(raw["state_dir"]),
        allowed_roots=tuple(path(str(p)) for p in raw["allowed_roots"]),
        watch=_typed(Watch, raw["watch"]), cubie=_typed(Cubie, raw["cubie"]), mobilint=_typed(Mobilint, raw["mobilint"]),
        limits=_typed(Limits, raw["limits"]), defaults=_typed(Defaults, raw["defaults"]), cache=_typed(Cache, raw["cache"]),
        log=_typed(Log, raw["log"]), metrics=_typed(Metrics, raw["metrics"]), notify=tuple(raw["notify"]),
        retention=_typed(Retention, raw["retention"]), dashboard=raw["dashboard"],
        keep_work=raw["keep_work"] or os.environ.get(f"{ENV_PREFIX}KEEP_WORK") == "1",
        engines=tuple(parse_engines(raw["engines"])),  # a bad engine fails at load, like every other key
        raw=raw,
        source=source,
        named_dirs="inbox" in user and "outbox" in user,
        accuracy=_typed(Accuracy, raw["accuracy"]),
        executor=parse_executor(raw["executor"], base),
    )


Section = TypeVar("Section")


def _typed(cls: type[Section], section: Mapping[str, Any]) -> Section:
    """A section's dataclass from its checked mapping; a float key given as an int becomes a float."""
    kinds = {f.name: f.type for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{key: float(value) if kinds[key] in ("float", float) else value for key, value in section.items()})


def load(path: Path | None) -> Config:
    """Load the config at `path`; without one, /etc/saigeedged/saigeedged.yml if present, else the defaults."""
    if path is None:
        if not DEFAULT_PATH.exists():
            return from_dict({}, Path.cwd())
        path = DEFAULT_PATH
    try:
        return from_dict(_read(path), path.resolve().parent, source=path)
    except SaigeError as exc:
        raise in_file(exc, path) from None


def in_file(exc: SaigeError, source: Path | None) -> SaigeError:
    """A bad key's error naming the config file it is in (`config: ...` said which key, not which file)."""
    if source is None or not exc.message.startswith("config: "):
        return exc
    return SaigeError(exc.code, f"config {source}: {exc.message.removeprefix('config: ')}", hint=exc.hint)


def _read(path: Path) -> Any:
    """The parsed YAML of the config file; every way it can fail is one SaigeError naming the file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SaigeError("INPUT_NOT_FOUND", f"config file {path} not found",
                         hint="-c takes the daemon's config file: the package installs /etc/saigeedged/saigeedged.yml, "
                         "config/saigeedged.yml is an example") from None
    except IsADirectoryError:
        raise SaigeError("INPUT_NOT_FOUND", f"config {path} is a directory, not a file",
                         hint="-c takes the config file itself, e.g. /etc/saigeedged/saigeedged.yml") from None
    except OSError as exc:  # permission denied, an I/O error on the share...
        raise SaigeError("INPUT_NOT_FOUND", f"cannot read config {path}: {exc.strerror}",
                         hint="the config must be readable by the service user: chmod 0644 it") from None
    except UnicodeDecodeError:
        raise SaigeError("MANIFEST_INVALID", f"config {path}: not UTF-8 text", hint=DOCUMENTED) from None
    try:
        safeyaml.check(text)  # the manifest's limits: a 5,000-digit number or 3,000 nested lists is one line, not a crash
        return yaml.safe_load(text) or {}
    except safeyaml.YamlRefused as exc:
        raise SaigeError("MANIFEST_INVALID", f"config {path}: {exc}", hint=DOCUMENTED) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SaigeError("MANIFEST_INVALID", f"config {path}: not valid YAML{where}: {what}",
                         hint=DOCUMENTED) from None

"""Manifests (SPEC §4, §3): one entry or a multi-model `models:` list, validated field by field."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saigeedged import guards, quantization, safeyaml
from saigeedged.engines import TARGETS
from saigeedged.errors import SaigeError
from saigeedged.profiles import CHANNEL_ORDERS, MOBILINT_DEVICES, PLATFORMS, PROFILES, TaskProfile

QUANTIZERS = ("asymmetric_affine", "dynamic_fixed_point", "perchannel_symmetric_affine", "qbfloat16", "float16")
QTYPES = ("uint8", "int16", "int8", "qbfloat16", "float16")
METHODS = ("ema", "minmax", "kl", "normal", "auto")
TOP_LEVEL_DEFAULTS = ("target", "calibration_method", "n_samples", "seed")
INTERNAL_HINT = ("a bug in saigeedged, not in the manifest: please report it with this message; after the fix, drop the "
                 "manifest and its ONNX (kept under <inbox>/.saigeedged/failed/<job_id>/) into the inbox again")

# field -> (accepted types, allowed values or None)
SCHEMA: dict[str, tuple[tuple[type, ...], tuple[Any, ...] | None]] = {
    "task": ((str,), tuple(PROFILES)),
    "num_classes": ((int,), None),
    "calib": ((str,), None),
    "onnx": ((str,), None),
    "output": ((str,), None),
    "target": ((str,), TARGETS),
    "platform": ((str,), tuple(PLATFORMS)),
    "input_size": ((list,), None),
    "calibration_method": ((str,), METHODS),
    "n_samples": ((int,), None),
    "seed": ((int,), None),
    "surgery": ((dict,), None),
    "runtime_overrides": ((dict,), None),
    "password": ((str,), None),
    "quantizer": ((str,), QUANTIZERS),
    "qtype": ((str,), QTYPES),
    "hybrid_topn": ((int,), None),
    "hybrid_dtype": ((str,), None),  # quantization.hybrid_dtype_problem
    "optimize": ((str,), None),
    "device": ((str,), MOBILINT_DEVICES),
    "preset": ((str,), None),
    "sha256": ((str,), None),
    "priority": ((int,), None),
    "name": ((str,), None),
    "keep_mblt": ((bool,), None),
    "request_id": ((str,), None),  # set by `saigeedged submit` to find its job's status file
    "cache": ((bool,), None),  # false: compile even when the cache holds this compile (SPEC §12)
    "input_channels": ((str,), CHANNEL_ORDERS),  # the channel order the model was trained on (SPEC §14)
    "eval_samples": ((int,), None),  # held-out images the accuracy report runs on (SPEC §17); 0: no report
    "accuracy": ((dict,), None),  # the gate {min_cosine, max_map_drop} over the config's (SPEC §17)
    "variants": ((list,), None),  # quantization settings to sweep; the best that passes the gate is published
}
MAX_VARIANTS = 8
VARIANT_KEYS = ("name", "calibration_method", "qtype", "quantizer", "hybrid_topn", "hybrid_dtype")
GATE_KEYS = ("min_cosine", "max_map_drop")
REQUIRED = ("task", "num_classes", "calib")
NAME_MAX = 255  # bytes in one file name (Linux filesystems)
MAX_MODELS = 256  # entries of one multi-model manifest: each is a job, claimed and announced in one go
INT_LIMIT = 2**31  # integers beyond it are no setting (SQLite, numpy seeds and status readers choke on some)


@dataclass(frozen=True)
class Entry:
    """One model to compile: validated manifest values with defaults applied and paths absolute."""

    task: str
    num_classes: int
    calib: Path
    onnx: Path
    stem: str
    manifest: Path
    target: str = "cubie"
    output: str | None = None
    platform: str = "a733"
    input_size: tuple[int, int] | None = None
    calibration_method: str = "ema"
    n_samples: int = 100
    seed: int = 1337
    surgery_outputs: tuple[str, ...] | None = None
    runtime_overrides: dict[str, Any] = field(default_factory=dict)
    password: str | None = field(default=None, repr=False)
    quantizer: str = "asymmetric_affine"
    qtype: str = "uint8"
    hybrid_topn: int = 0
    hybrid_dtype: str = "float16"
    optimize: str | None = None
    device: str | None = None
    preset: str | None = None
    sha256: str | None = None
    priority: int = 0
    keep_mblt: bool = False
    request_id: str | None = None
    cache: bool = True
    input_channels: str | None = None  # None: the task profile's default
    eval_samples: int = 16
    accuracy: dict[str, float] | None = None  # gate values over the config's `accuracy:` (None: the config's)
    variants: list[dict[str, Any]] | None = None  # SPEC §17: each overrides some of VARIANT_KEYS

    @property
    def profile(self) -> TaskProfile:
        return PROFILES[self.task]

    @property
    def channels(self) -> str:
        """`input_channels` as written, else the task profile's default (SPEC §14)."""
        return self.input_channels or self.profile.input_channels

    @property
    def output_name(self) -> str:
        """`output:` as written, else `<stem>.<target>.saigeedge`."""
        return self.output or f"{self.stem}.{self.target}.saigeedge"


def invalid(path: Path, message: str) -> SaigeError:
    return SaigeError("MANIFEST_INVALID", f"{guards.printable(path.name)}: {message}")


def safe_stem(text: str) -> str:
    """Restrict a name to [A-Za-z0-9._-] (SPEC §3)."""
    return guards.short_stem(re.sub(r"[^A-Za-z0-9._-]", "_", text).strip(".")) or "model"


def _check_field(path: Path, key: str, value: Any) -> None:
    found = problem(key, value)
    if found is not None:
        raise invalid(path, found)


def problem(key: str, value: Any, where: str | None = None) -> str | None:
    """Why `key: value` is no valid manifest field (None: it is one), the field named as `where` (a variant's:
    `variants[i].key`). The daemon config's `defaults:` and `accuracy:` hold manifest values and are checked by the
    same rules (config.py)."""
    if key not in SCHEMA:
        near = difflib.get_close_matches(key, list(SCHEMA), n=1)
        tip = f" (did you mean `{near[0]}`?)" if near else ""
        return f"unknown key `{key}`{tip}"
    types, choices = SCHEMA[key]
    if value is None and key in ("optimize", "preset", "sha256", "name", "output", "password", "device", "request_id",
                                     "input_channels"):
        return None
    got = "a value not shown" if key == "password" else safeyaml.shown(value)
    where = where or key
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        return f"`{where}` must be {types[0].__name__}, got {got}"
    if choices is not None and value not in choices:
        return f"`{where}` must be one of {', '.join(map(str, choices))}, got {got}"
    if key == "hybrid_dtype" and isinstance(value, str):
        return quantization.hybrid_dtype_problem(value, where)
    if isinstance(value, int) and not -INT_LIMIT < value < (2 * INT_LIMIT if key == "seed" else INT_LIMIT):
        return f"`{where}` is out of range, got {safeyaml.shown(value)}"
    if key == "accuracy" and isinstance(value, dict):
        return _gate(value)
    if key == "variants" and isinstance(value, list):
        return _variants(value)
    minimum = {"num_classes": 1, "n_samples": 1, "hybrid_topn": 0, "eval_samples": 0}.get(key)
    if minimum is not None and isinstance(value, int) and value < minimum:
        return f"`{where}` must be {'positive' if minimum else '>= 0'}, got {value}"
    return None


def _gate(value: dict[str, Any]) -> str | None:
    """`accuracy: {min_cosine, max_map_drop}`: numbers in [0, 1]."""
    for key, bound in value.items():
        if key not in GATE_KEYS:
            return f"unknown key `accuracy.{guards.printable(str(key)[:80])}` (allowed: {', '.join(GATE_KEYS)})"
        if not isinstance(bound, (int, float)) or isinstance(bound, bool) or not 0.0 <= bound <= 1.0:
            return f"`accuracy.{key}` must be a number in [0, 1], got {safeyaml.shown(bound)}"
    return None


def _variants(value: list[Any]) -> str | None:
    """At most MAX_VARIANTS mappings of VARIANT_KEYS, each value checked like the entry's own field."""
    if not value or len(value) > MAX_VARIANTS:
        return f"`variants` must list 1 to {MAX_VARIANTS} variants, got {len(value)}"
    for i, variant in enumerate(value):
        if not isinstance(variant, dict):
            return f"`variants[{i}]` must be a mapping of {', '.join(VARIANT_KEYS)}"
        for key, item in variant.items():
            if key not in VARIANT_KEYS:
                return f"`variants[{i}]`: unknown key `{guards.printable(str(key)[:80])}` (allowed: {', '.join(VARIANT_KEYS)})"
            found = problem(key, item, f"variants[{i}].{key}") or _variant_name(i, key, item)
            if found is not None:
                return found
    return None


def _variant_name(index: int, key: str, value: Any) -> str | None:
    """A variant's `name` is shown in the job log, the report's table and the dashboard: a short printable line."""
    if key != "name" or not isinstance(value, str):
        return None
    if len(value) > guards.MAX_STEM:
        return f"`variants[{index}].name` must be at most {guards.MAX_STEM} characters, got {len(value)}"
    if guards.printable(value) != value:
        return f"`variants[{index}].name` must not contain control characters, got {safeyaml.shown(value)}"
    return None


def _input_size(path: Path, value: list[Any]) -> tuple[int, int]:
    if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise invalid(path, f"`input_size` must be [H, W] with two positive integers, got {safeyaml.shown(value)}")
    return int(value[0]), int(value[1])


def _surgery(path: Path, value: dict[str, Any]) -> tuple[str, ...]:
    names = value.get("output_names")
    if set(value) != {"output_names"} or not isinstance(names, list) or len(names) != 3 \
            or not all(isinstance(n, str) and n for n in names):
        raise invalid(path, "`surgery` must be {output_names: [three tensor names]} (stride 8/16/32)")
    return tuple(names)


def _resolve(path: Path, value: str) -> Path:
    """Absolute or relative to the manifest, with `..` folded (symlinks are not followed here: PathPolicy does)."""
    try:
        p = Path(value).expanduser()
    except RuntimeError:  # `~nosuchuser/x`
        raise invalid(path, f"{safeyaml.shown(value)}: the user's home folder cannot be found") from None
    if "\0" in value:
        raise invalid(path, "a path must not contain a NUL character")
    return Path(os.path.normpath(p if p.is_absolute() else path.parent / p))


def build_entry(path: Path, data: dict[str, Any], stem: str, *, drop: bool) -> Entry:
    """Validate one entry's mapping (defaults already merged in) into an Entry."""
    for key, value in data.items():
        _check_field(path, str(key), value)
    for key in REQUIRED:
        if key not in data:
            raise invalid(path, f"`{key}` is required")
    target = data.get("target", "cubie")
    if target == "mobilint" and not data.get("device"):
        raise invalid(path, f"`device` is required for target mobilint: one of {', '.join(MOBILINT_DEVICES)}")
    output = data.get("output")
    refused = guards.output_problem(output) if drop and output is not None else None
    if refused:
        raise invalid(path, f"`output` {refused}, got {safeyaml.shown(output)}")
    refused = guards.overrides_problem(data.get("runtime_overrides") or {})
    if refused:
        raise invalid(path, f"`runtime_overrides` {refused}")
    onnx = _resolve(path, data["onnx"]) if data.get("onnx") else path.with_suffix(".onnx")
    if len(os.fsencode(onnx.name)) > NAME_MAX:
        raise invalid(path, f"the ONNX's name `{guards.printable(onnx.name[:40])}...` is longer than {NAME_MAX} bytes: "
                      "no file can have it (shorten the manifest's name)")
    kwargs = {k: v for k, v in data.items() if k in Entry.__dataclass_fields__ and k not in ("calib", "onnx", "name")}
    kwargs["input_size"] = _input_size(path, data["input_size"]) if "input_size" in data else None
    kwargs["surgery_outputs"] = _surgery(path, data["surgery"]) if "surgery" in data else None
    kwargs.pop("surgery", None)
    if "accuracy" in data:
        kwargs["accuracy"] = {k: float(v) for k, v in data["accuracy"].items()}
    return Entry(calib=_resolve(path, data["calib"]), onnx=onnx, stem=safe_stem(stem), manifest=path, **kwargs)


def load(path: Path, defaults: dict[str, Any] | None = None, *, drop: bool = False) -> list[Entry]:
    """Parse a manifest file into entries; a `models:` list gives one entry per model.

    Whatever is in the file, the outcome is entries or a SaigeError: anyone can drop a manifest. Every refusal of
    its content is raised by a check as MANIFEST_INVALID (or INPUT_NOT_FOUND); any other exception is INTERNAL.
    """
    try:
        return _load(path, defaults, drop)
    except SaigeError:
        raise
    except Exception as exc:  # a guard: the caller (the inbox's scan, validate) goes on, this manifest fails; but no
        # check raised it, so it is saigeedged's bug (a check missing, code changed under a running daemon), and
        # MANIFEST_INVALID would fail a valid drop for good telling its dropper to fix it
        raise SaigeError("INTERNAL", f"{guards.printable(path.name)}: reading the manifest raised "
                         f"{type(exc).__name__}: {guards.printable(str(exc)[:200])}", hint=INTERNAL_HINT) from exc


def _named(exc: SaigeError, data: dict[str, Any]) -> SaigeError:
    """A refused single-model manifest's own `name:` and `request_id:` on its error (when they are strings), so its
    failed job is named as the drop meant (`submit`'s files are `<name>.<request id>.yml`) and `submit` finds it."""
    for key, field_name in (("name", "drop_name"), ("request_id", "request_id")):
        value = data.get(key)
        if isinstance(value, str) and value and len(value) <= 256:
            exc.fields.setdefault(field_name, value)
    return exc


def _models(path: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The `models:` list of a multi-model manifest, checked for shape and size."""
    models = data["models"]
    extra = set(data) - set(TOP_LEVEL_DEFAULTS) - {"models"}
    if extra:
        raise invalid(path, f"unknown top-level key `{sorted(extra)[0]}` (allowed: {', '.join(TOP_LEVEL_DEFAULTS)}, models)")
    if not isinstance(models, list) or not models or not all(isinstance(m, dict) for m in models):
        raise invalid(path, "`models` must be a non-empty list of mappings")
    if len(models) > MAX_MODELS:
        raise invalid(path, f"`models` lists {len(models)} entries, at most {MAX_MODELS}: split the manifest")
    return models


def _load(path: Path, defaults: dict[str, Any] | None, drop: bool) -> list[Entry]:
    try:
        data = safeyaml.load(path)
    except FileNotFoundError:
        raise SaigeError("INPUT_NOT_FOUND", f"manifest {path} not found") from None
    except UnicodeDecodeError as exc:
        raise invalid(path, f"not UTF-8 text (byte {exc.start})") from None
    except safeyaml.YamlRefused as exc:
        raise invalid(path, str(exc)) from None
    if not isinstance(data, dict):
        raise invalid(path, "the manifest must be a mapping")
    base = dict(defaults or {})
    if "models" not in data:
        try:
            return [build_entry(path, {**base, **data}, data.get("name") or path.stem, drop=drop)]
        except SaigeError as exc:
            raise _named(exc, data) from None
    return _entries(path, data, base, drop)


def _entries(path: Path, data: dict[str, Any], base: dict[str, Any], drop: bool) -> list[Entry]:
    """A multi-model manifest's entries, each its `models:` item over the shared defaults over the config's."""
    models = _models(path, data)
    top = {k: data[k] for k in TOP_LEVEL_DEFAULTS if k in data}
    for key, value in top.items():  # the shared defaults' own errors, before any model's
        _check_field(path, key, value)
    entries = []
    for index, model in enumerate(models):
        if "onnx" not in model:
            raise invalid(path, f"models[{index}]: `onnx` is required in a multi-model manifest")
        stem = model.get("name") or f"{path.stem}.{model.get('task', index)}"
        try:
            entries.append(build_entry(path, {**base, **top, **model}, stem, drop=drop))
        except SaigeError as exc:
            raise _in_model(exc, path, index) from None
    return entries


def _in_model(exc: SaigeError, path: Path, index: int) -> SaigeError:
    """A multi-model manifest's refusal names the entry (`models[1]: `qtype` must be ...`): it named the field only."""
    prefix = f"{guards.printable(path.name)}: "
    if exc.code != "MANIFEST_INVALID" or not exc.message.startswith(prefix):
        return exc
    return SaigeError(exc.code, f"{prefix}models[{index}]: {exc.message.removeprefix(prefix)}", hint=exc.hint,
                      **exc.fields)

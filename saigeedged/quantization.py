"""Which quantization settings each target honours (pure, SPEC §4, §17): a setting a target's compiler is never given
compiles the same model under another name, which validate and the job log say as a warning (a drop that asks for it
still compiles: SPEC §17 has mobilint's emulated report follow the manifest's algorithm)."""

from __future__ import annotations

import re
from typing import Any

from saigeedged import safeyaml

# The entry's quantization fields and their defaults (manifest.Entry): a default value asks for nothing
DEFAULTS: dict[str, Any] = {"calibration_method": "ema", "qtype": "uint8", "quantizer": "asymmetric_affine",
                            "hybrid_topn": 0, "hybrid_dtype": "float16"}
# notes/pegasus.md "Hybrid quantization": `<layer>: <quantizer>-<qtype>` lines (dynamic_fixed_point-i16,
# asymmetric_affine-u8, perchannel_symmetric_affine-i8, bfloat16-bfloat16, ...), and `float16` (the manifest's default;
# README: the A733 warns of it). The form only: which pairs a given pegasus takes is its own to say (its quantize step
# names the layer), and a closed list refused spellings it does take.
HYBRID_DTYPE = re.compile(r"float16|[a-z][a-z0-9_]*-[a-z][a-z0-9_]*")
HYBRID_DTYPE_FORM = "float16 or <quantizer>-<qtype> as pegasus writes them (dynamic_fixed_point-i16, asymmetric_affine-u8)"

_MOBILINT = ("qbcompiler is never given it: its parse and quantize take a --config-preset and a --compile-config, no "
             "calibration method, qtype, quantizer or hybrid layers (notes/mobilint.md), so every value compiles the "
             "same .mxq; only the report's emulation follows it")
_HYBRID = "hybrid layers are a cubie (pegasus) setting; the host target quantizes every tensor alike"
# target -> field -> (the values its compiler honours, why the others change nothing); a field not listed takes any value
HONOURED: dict[str, dict[str, tuple[tuple[Any, ...], str]]] = {
    "mobilint": {key: ((value,), _MOBILINT) for key, value in DEFAULTS.items()},
    "host": {"qtype": (("uint8", "int16"), "the host target quantizes uint8 or int16 (onnxruntime QDQ)"),
             "quantizer": (("asymmetric_affine",), "the host target quantizes asymmetric per tensor (onnxruntime QDQ)"),
             "hybrid_topn": ((0,), _HYBRID), "hybrid_dtype": (("float16",), _HYBRID)},
}


def unhonoured(target: str, key: str, value: Any, where: str) -> str | None:
    """Why `key: value` (written as `where`) changes nothing for `target`, or None: the target's compiler honours it."""
    rule = HONOURED.get(target, {}).get(key)
    if rule is None or value in rule[0]:
        return None
    allowed, why = rule
    takes = f"only {safeyaml.shown(allowed[0])}" if len(allowed) == 1 else f"one of {', '.join(map(str, allowed))}"
    return f"`{where}` {safeyaml.shown(value)} has no effect for target {target} (it takes {takes}): {why}"


# two spellings of one calibration: plain min/max (pegasus `normal`, onnxruntime MinMax without a moving average)
SAME_METHOD = {"minmax": "normal"}


def compiled_as(target: str, entry: Any) -> tuple[tuple[str, Any], ...]:
    """The quantization `target`'s compiler is given for a manifest.Entry: each setting it does not honour at its
    default, hybrid_dtype at its default without hybrid layers. Two entries with the same compile the same model."""
    given = {}
    for key, default in DEFAULTS.items():
        value = getattr(entry, key)
        given[key] = default if unhonoured(target, key, value, key) else value
    given["calibration_method"] = SAME_METHOD.get(given["calibration_method"], given["calibration_method"])
    if not given["hybrid_topn"]:
        given["hybrid_dtype"] = DEFAULTS["hybrid_dtype"]
    return tuple(given.items())


def warnings(entry: Any) -> list[str]:
    """The settings of a manifest.Entry (not imported: manifest imports this module), then of each of its variants,
    that its target's compiler does not honour."""
    said = [unhonoured(entry.target, key, getattr(entry, key), key) for key in DEFAULTS]
    said += [unhonoured(entry.target, key, value, f"variants[{i}].{key}")
             for i, overrides in enumerate(entry.variants or []) for key, value in overrides.items() if key in DEFAULTS]
    return [text for text in said if text is not None]


def hybrid_dtype_problem(value: str, where: str) -> str | None:
    """Why `value` is no hybrid_dtype (written as `where`), or None: `float16` or a `<quantizer>-<qtype>` spelling."""
    if len(value) <= 64 and HYBRID_DTYPE.fullmatch(value):
        return None
    return f"`{where}` must be {HYBRID_DTYPE_FORM}, got {safeyaml.shown(value)}"

"""Which quantization settings each target honours (pure checks, SPEC §4, §17): a setting a target's compiler is never
given would compile the same model under another name, so a manifest may not ask for it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from saigeedged import safeyaml

# The entry's quantization fields and their defaults (manifest.Entry): a default value asks for nothing
DEFAULTS: dict[str, Any] = {"calibration_method": "ema", "qtype": "uint8", "quantizer": "asymmetric_affine",
                            "hybrid_topn": 0, "hybrid_dtype": "float16"}
# notes/pegasus.md "Hybrid quantization": `<layer>: <quantizer>-<qtype>` lines, seen `dynamic_fixed_point-i16` and
# `bfloat16-bfloat16`; `float16` is the manifest's default (README: the A733 warns of it)
HYBRID_DTYPES = ("float16", "dynamic_fixed_point-i16", "bfloat16-bfloat16")

_MOBILINT = ("qbcompiler is never given it: its parse and quantize take a --config-preset and a --compile-config, no "
             "calibration method, qtype, quantizer or hybrid layers (notes/mobilint.md), so every value compiles the "
             "same .mxq")
_HYBRID = "hybrid layers are a cubie (pegasus) setting; the host target quantizes every tensor alike"
# target -> field -> (the values its compiler honours, why the others are refused); a field not listed takes any value
HONOURED: dict[str, dict[str, tuple[tuple[Any, ...], str]]] = {
    "mobilint": {key: ((value,), _MOBILINT) for key, value in DEFAULTS.items()},
    "host": {"qtype": (("uint8", "int16"), "the host target quantizes uint8 or int16 (onnxruntime QDQ)"),
             "quantizer": (("asymmetric_affine",), "the host target quantizes asymmetric per tensor (onnxruntime QDQ)"),
             "hybrid_topn": ((0,), _HYBRID), "hybrid_dtype": (("float16",), _HYBRID)},
}


def refused(target: str, key: str, value: Any, where: str) -> str | None:
    """Why `key: value` (written as `where`) is refused for `target`, or None: the target's compiler honours it."""
    rule = HONOURED.get(target, {}).get(key)
    if rule is None or value in rule[0]:
        return None
    allowed, why = rule
    takes = f"only {safeyaml.shown(allowed[0])}" if len(allowed) == 1 else f"one of {', '.join(map(str, allowed))}"
    return f"`{where}` {safeyaml.shown(value)} is not supported for target {target} (it takes {takes}): {why}"


def applicable(target: str, data: dict[str, Any], written: Mapping[str, Any]) -> dict[str, Any]:
    """An entry's merged fields without the daemon config's `defaults:` that `target` does not honour (a default
    meant for cubie, `qtype: int16`, does not apply to a mobilint drop): never recorded as what made its model."""
    return {k: v for k, v in data.items() if k in written or refused(target, k, v, k) is None}


def target_problem(target: str, written: Mapping[str, Any], variants: Sequence[Mapping[str, Any]]) -> str | None:
    """Why an entry for `target` asks for a setting its compiler does not honour: `written`, the fields the manifest
    itself sets (not the daemon config's `defaults:`, which serve every target), then each variant's."""
    for key in DEFAULTS:
        found = refused(target, key, written[key], key) if key in written else None
        if found is not None:
            return found
    for i, overrides in enumerate(variants):
        for key, value in overrides.items():
            found = refused(target, key, value, f"variants[{i}].{key}") if key in DEFAULTS else None
            if found is not None:
                return found
    return None

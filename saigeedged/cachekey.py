"""The compile key of SPEC §12 (pure): what decides a compiled artifact, hashed in a canonical form."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from saigeedged.jobs import entry_to_doc
from saigeedged.manifest import Entry

# Entry fields that never change the compiled artifact: where it goes, who asked, the drop's name, what only the
# bundle's checkpoint.yaml says (runtime_overrides, the bundle is built per job), and what other key inputs already
# cover (the ONNX and calibration paths and sha256: their digests are in the key)
NOT_IN_KEY = frozenset({"output", "password", "request_id", "priority", "stem", "manifest", "onnx", "calib", "sha256",
                        # the accuracy report is made per job; a variant is keyed by its own fields
                        "runtime_overrides", "cache", "eval_samples", "accuracy", "variants"})
KEY_SCHEMA = 2  # bump when the key's inputs change meaning


@dataclass(frozen=True)
class KeyInputs:
    """Everything a compile's key is made of."""

    onnx_sha256: str
    fields: Mapping[str, Any]  # compile_fields()
    calib_sha256: Sequence[str]  # of the calibration images actually chosen, in their order
    toolchain: Mapping[str, Any]  # {"image": ref, "image_id": id} or {"onnxruntime": version}
    version: str  # saigeedged's


def compile_fields(entry: Entry, resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The entry's compile-relevant fields with defaults applied; `resolved` holds what the inputs decided
    (input_size from the ONNX, surgery outputs, the --optimize target, the preset, the channel order)."""
    fields = {k: v for k, v in entry_to_doc(entry).items() if k not in NOT_IN_KEY}
    fields.update(resolved)
    return fields


def canonical(value: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, tuples as lists; equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def toolchain_id(toolchain: Mapping[str, Any]) -> dict[str, Any]:
    """The part of the toolchain record that identifies it: the image ID (a tag can move), or the onnxruntime version."""
    return {k: v for k, v in toolchain.items() if k != "image"}


def compile_key(inputs: KeyInputs) -> str:
    """sha256 hex over the key's inputs in canonical JSON."""
    doc = {"schema": KEY_SCHEMA, "onnx": inputs.onnx_sha256, "fields": dict(inputs.fields),
           "calib": list(inputs.calib_sha256), "toolchain": toolchain_id(inputs.toolchain), "saigeedged": inputs.version}
    return hashlib.sha256(canonical(doc).encode()).hexdigest()


def calib_digests_text(rows: Sequence[tuple[str, str]]) -> str:
    """calib_digests.txt: `<sha256>  <image>` per chosen calibration image, in order (the sha256sum format)."""
    return "".join(f"{digest}  {name}\n" for digest, name in rows)

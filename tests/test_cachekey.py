"""The compile key (SPEC §12): every input that makes the artifact changes it, nothing else does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from saigeedged import cachekey
from saigeedged.cachekey import KeyInputs
from saigeedged.manifest import build_entry

BASE: dict[str, Any] = {"task": "detection", "num_classes": 3, "calib": "/data/val.json", "target": "cubie"}
TOOLS = {"image": "ubuntu-npu:v2.0.10.1", "image_id": "sha256:" + "a" * 64}


def key(manifest: dict[str, Any] | None = None, *, name: str = "det", folder: str = "/inbox", onnx: str = "1" * 64,
        calib: tuple[str, ...] = ("c1", "c2"), tools: dict[str, Any] | None = None, version: str = "0.1.0",
        resolved: dict[str, Any] | None = None) -> str:
    entry = build_entry(Path(folder) / f"{name}.yml", {**BASE, **(manifest or {})}, name, drop=True)
    fields = cachekey.compile_fields(entry, {"input_size": [64, 64], "input_channels": entry.channels,
                                             **(resolved or {})})
    return cachekey.compile_key(KeyInputs(onnx, fields, calib, tools or TOOLS, version))


@pytest.mark.parametrize("change", [
    {"num_classes": 4}, {"task": "mlc"}, {"target": "host"}, {"platform": "t527"}, {"calibration_method": "kl"},
    {"n_samples": 50}, {"seed": 1}, {"quantizer": "dynamic_fixed_point"}, {"qtype": "int16"}, {"hybrid_topn": 2},
    {"hybrid_dtype": "bfloat16-bfloat16"}, {"optimize": "VIP9000NANODI_PID0X1000003B"}, {"input_channels": "rgb"},
    {"surgery": {"output_names": ["a", "b", "c"]}}, {"keep_mblt": True},
])
def test_each_compile_field_changes_the_key(change: dict[str, Any]) -> None:
    """A different value of any compile-relevant manifest field gives another key."""
    assert key(change) != key()


def test_the_other_inputs_change_the_key() -> None:
    """The ONNX digest, the chosen calibration digests (and their order), the image ID, the saigeedged version and
    what the inputs resolved (input size, surgery outputs) each change the key."""
    base = key()
    others = [key(onnx="2" * 64), key(calib=("c1", "c3")), key(calib=("c2", "c1")), key(calib=("c1",)),
              key(tools={**TOOLS, "image_id": "sha256:" + "b" * 64}), key(tools={"onnxruntime": "1.19.0"}),
              key(version="0.2.0"), key(resolved={"input_size": [32, 32]}), key(resolved={"optimize": "X"})]
    assert len({base, *others}) == len(others) + 1


def test_what_does_not_make_the_artifact_leaves_the_key_alone() -> None:
    """Output path, password, request_id, priority, the drop's name and folder, runtime_overrides and cache: false
    do not change the key; neither does the image's tag when its ID is the same."""
    base = key()
    same = [key({"output": "renamed.saigeedge"}), key({"password": "s3cret"}), key({"request_id": "abc"}),
            key({"priority": 9}), key(name="renamed"), key(folder="/inbox/teamB"), key({"sha256": "f" * 64}),
            key({"runtime_overrides": {"postprocess": {"conf_threshold": 0.5}}}), key({"cache": False}),
            key({"name": "entry"}), key(tools={**TOOLS, "image": "ubuntu-npu:latest"})]
    assert set(same) == {base}


def test_the_profile_default_and_the_same_value_written_give_one_key() -> None:
    """Defaults are resolved before hashing: writing the default value explicitly is the same compile."""
    assert key({"input_channels": "bgr"}) == key() and key({"platform": "a733", "seed": 1337}) == key({"seed": 1337})


def test_key_is_stable_sha256_hex() -> None:
    """The key is a 64-hex sha256 that does not depend on dict ordering."""
    a = cachekey.compile_key(KeyInputs("x", {"a": 1, "b": [1, 2]}, ["c"], {"onnxruntime": "1"}, "v"))
    b = cachekey.compile_key(KeyInputs("x", {"b": [1, 2], "a": 1}, ["c"], {"onnxruntime": "1"}, "v"))
    assert a == b and len(a) == 64 and int(a, 16) >= 0


def test_calib_digests_text_is_sha256sum_format() -> None:
    """calib_digests.txt lists `<sha256>  <image>` per chosen image, in order."""
    assert cachekey.calib_digests_text([("ab", "/d/1.jpg"), ("cd", "/d/2.jpg")]) == "ab  /d/1.jpg\ncd  /d/2.jpg\n"

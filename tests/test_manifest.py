"""Manifest parsing and validation (SPEC §4)."""

from pathlib import Path

import pytest
from factory import manifest

from saigeedged import manifest as manifestmod
from saigeedged.errors import SaigeError

BASE = {"task": "detection", "num_classes": 3, "calib": "val.json"}


def load_one(path: Path, drop: bool = False, **fields: object) -> manifestmod.Entry:
    manifest(path, **{**BASE, **fields})
    (entry,) = manifestmod.load(path, drop=drop)
    return entry


def test_sidecar_defaults(tmp_path: Path) -> None:
    """A sidecar manifest compiles its sibling ONNX with the documented defaults."""
    entry = load_one(tmp_path / "det.yml")
    assert entry.onnx == tmp_path / "det.onnx"
    assert entry.calib == tmp_path / "val.json"
    assert (entry.target, entry.platform, entry.quantizer, entry.qtype) == ("cubie", "a733", "asymmetric_affine", "uint8")
    assert (entry.calibration_method, entry.n_samples, entry.seed, entry.stem) == ("ema", 100, 1337, "det")


def test_config_defaults_apply_and_manifest_wins(tmp_path: Path) -> None:
    """Config `defaults:` fill missing keys; values in the manifest win."""
    manifest(tmp_path / "m.yml", **BASE, seed=7)
    (entry,) = manifestmod.load(tmp_path / "m.yml", {"target": "host", "seed": 1, "n_samples": 5})
    assert (entry.target, entry.seed, entry.n_samples) == ("host", 7, 5)


@pytest.mark.parametrize(("fields", "named"), [
    ({"task": "segmentation"}, "task"),
    ({"num_classes": 0}, "num_classes"),
    ({"num_classes": "3"}, "num_classes"),
    ({"n_samples": -1}, "n_samples"),
    ({"target": "rk3588"}, "target"),
    ({"platform": "a311d"}, "platform"),
    ({"device": "ARIES", "target": "mobilint"}, "device"),
    ({"quantizer": "int8"}, "quantizer"),
    ({"input_size": [640]}, "input_size"),
    ({"surgery": {"outputs": ["a"]}}, "surgery"),
    ({"calibraton_method": "ema"}, "calibration_method"),
    ({"keep_mblt": "yes"}, "keep_mblt"),
])
def test_invalid_fields_are_named(tmp_path: Path, fields: dict[str, object], named: str) -> None:
    """Each bad value is MANIFEST_INVALID and the message names the field."""
    with pytest.raises(SaigeError) as err:
        load_one(tmp_path / "m.yml", **fields)
    assert err.value.code == "MANIFEST_INVALID"
    assert f"`{named}`" in err.value.message


def test_required_keys(tmp_path: Path) -> None:
    """task, num_classes and calib are required."""
    manifest(tmp_path / "m.yml", task="mlc", calib="v.json")
    with pytest.raises(SaigeError, match="`num_classes` is required"):
        manifestmod.load(tmp_path / "m.yml")


def test_mobilint_needs_a_device(tmp_path: Path) -> None:
    """target mobilint without device lists the valid devices."""
    with pytest.raises(SaigeError, match="regulus-rb-usb"):
        load_one(tmp_path / "m.yml", target="mobilint")


@pytest.mark.parametrize("output", ["/abs/x.saigeedge", "../escape.saigeedge", "a/../../b"])
def test_drop_output_must_stay_in_its_folder(tmp_path: Path, output: str) -> None:
    """In a drop, an absolute or `..` output is refused; the CLI accepts it."""
    with pytest.raises(SaigeError, match="`output`"):
        load_one(tmp_path / "m.yml", drop=True, output=output)
    assert load_one(tmp_path / "m.yml", output=output).output == output


def test_multi_model_manifest(tmp_path: Path) -> None:
    """Each `models:` entry is its own job, with top-level defaults and `<manifest>.<task>` or `name:` stems."""
    manifest(tmp_path / "compile_models.yml", target="host", seed=3, models=[
        {"task": "detection", "onnx": "det/best.onnx", "calib": "/data/val.json", "num_classes": 2},
        {"task": "reid", "onnx": "/m/reid.onnx", "calib": "r.json", "num_classes": 5, "name": "person reid", "seed": 9},
    ])
    det, reid = manifestmod.load(tmp_path / "compile_models.yml")
    assert det.stem == "compile_models.detection" and det.onnx == tmp_path / "det" / "best.onnx"
    assert det.calib == Path("/data/val.json") and det.target == "host" and det.seed == 3
    assert reid.stem == "person_reid" and reid.seed == 9 and reid.onnx == Path("/m/reid.onnx")


def test_multi_model_rejects_unknown_top_level_key(tmp_path: Path) -> None:
    """Only the four defaults and `models` may stand at the top of a multi-model manifest."""
    manifest(tmp_path / "m.yml", platform="t527", models=[{**BASE, "onnx": "a.onnx"}])
    with pytest.raises(SaigeError, match="platform"):
        manifestmod.load(tmp_path / "m.yml")


def test_a_multi_model_refusal_names_the_entry(tmp_path: Path) -> None:
    """A bad field of the second model is refused naming `models[1]` (it named the field only, in a file of many
    entries); a bad shared default is named without an entry."""
    manifest(tmp_path / "m.yml", target="host", models=[{**BASE, "onnx": "a.onnx"}, {**BASE, "onnx": "b.onnx",
                                                                                       "qtype": "int3"}])
    with pytest.raises(SaigeError) as raised:
        manifestmod.load(tmp_path / "m.yml")
    assert raised.value.code == "MANIFEST_INVALID" and raised.value.message.startswith("m.yml: models[1]: `qtype`")
    manifest(tmp_path / "m.yml", seed="x", models=[{**BASE, "onnx": "a.onnx"}])
    with pytest.raises(SaigeError) as raised:
        manifestmod.load(tmp_path / "m.yml")
    assert raised.value.message.startswith("m.yml: `seed`")


def test_not_yaml(tmp_path: Path) -> None:
    """A manifest that is not YAML is MANIFEST_INVALID, naming the file."""
    (tmp_path / "m.yml").write_text("task: [unclosed\n")
    with pytest.raises(SaigeError, match="m.yml: not valid YAML"):
        manifestmod.load(tmp_path / "m.yml")


def test_stem_is_restricted(tmp_path: Path) -> None:
    """Job stems keep only [A-Za-z0-9._-]."""
    assert load_one(tmp_path / "my model (v2).yml").stem == "my_model__v2_"


def test_an_exception_no_check_raised_is_internal_never_the_manifests_fault(tmp_path: Path) -> None:
    """An exception no check raised while a valid manifest is read (here a caller's `defaults` that are not a
    mapping: a bug) is INTERNAL naming the file and the exception with a bug's hint, never MANIFEST_INVALID."""
    path = manifest(tmp_path / "det.yml", **BASE)
    with pytest.raises(SaigeError) as refused:
        manifestmod.load(path, ["target"], drop=True)  # type: ignore[arg-type]
    assert refused.value.code == "INTERNAL" and refused.value.message.startswith("det.yml: ")
    assert "ValueError: dictionary update sequence" in refused.value.message
    assert "a bug in saigeedged, not in the manifest" in refused.value.hint

"""Quantization settings per target (SPEC §4, §17): what a target's compiler never receives is refused, naming the
field (a variant's as `variants[i].field`); what is compiled is what the report names."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from factory import checkpoint, det_manifest

from saigeedged import manifest as manifestmod
from saigeedged.cli import main as cli
from saigeedged.errors import SaigeError


def _refusal(path: Path, defaults: dict[str, Any] | None = None) -> str:
    with pytest.raises(SaigeError) as err:
        manifestmod.load(path, defaults)
    assert err.value.code == "MANIFEST_INVALID"
    return err.value.message


@pytest.mark.parametrize(("fields", "named"), [
    ({"variants": [{"calibration_method": "kl"}]}, "`variants[0].calibration_method` 'kl'"),
    ({"variants": [{"name": "a"}, {"qtype": "int16"}]}, "`variants[1].qtype` 'int16'"),
    ({"calibration_method": "minmax"}, "`calibration_method` 'minmax'"),
    ({"qtype": "int16"}, "`qtype` 'int16'"),
    ({"hybrid_topn": 2}, "`hybrid_topn` 2"),
])
def test_mobilint_refuses_settings_qbcompiler_is_never_given(tmp_path: Path, fields: dict[str, Any],
                                                             named: str) -> None:
    """A calibration method, qtype or hybrid layers on mobilint (top level or a variant) is MANIFEST_INVALID naming
    the field and why: qbcompiler takes none of them, so every variant compiled the same .mxq."""
    mf = det_manifest(tmp_path, target="mobilint", device="regulus-rb", **fields)
    said = _refusal(mf)
    assert named in said and "not supported for target mobilint" in said and "qbcompiler is never given it" in said


def test_mobilint_refusal_exits_2_and_defaults_are_not_applied(tmp_path: Path, config_path: Path,
                                                               capsys: Any) -> None:
    """`validate` of a mobilint sweep of calibration methods exits 2 with the code, the field and a hint; the
    daemon config's `defaults:` (meant for every target) neither refuses a mobilint drop nor becomes its setting."""
    mf = det_manifest(tmp_path, target="mobilint", device="regulus-rb", variants=[{"calibration_method": "kl"}])
    assert cli.main(["validate", str(mf), "-c", str(config_path)]) == 2
    err = capsys.readouterr().err
    assert "saigeedged: MANIFEST_INVALID:" in err and "variants[0].calibration_method" in err and "hint:" in err
    plain = det_manifest(tmp_path, target="mobilint", device="regulus-rb", calibration_method="ema")
    entry = manifestmod.load(plain, {"calibration_method": "kl", "qtype": "int16"})[0]
    assert (entry.calibration_method, entry.qtype) == ("ema", "uint8")


@pytest.mark.parametrize(("fields", "named"), [
    ({"variants": [{"qtype": "float16"}]}, "`variants[0].qtype` 'float16'"),
    ({"variants": [{"hybrid_topn": 2}]}, "`variants[0].hybrid_topn` 2"),
    ({"variants": [{"quantizer": "qbfloat16"}]}, "`variants[0].quantizer` 'qbfloat16'"),
    ({"qtype": "int8"}, "`qtype` 'int8'"),
])
def test_host_refuses_settings_it_does_not_honour(tmp_path: Path, fields: dict[str, Any], named: str) -> None:
    """The host target quantizes uint8 or int16 asymmetric without hybrid layers: any other qtype, quantizer or
    hybrid layers are MANIFEST_INVALID naming the field (they were ignored, the variant listed as distinct)."""
    said = _refusal(det_manifest(tmp_path, target="host", **fields))
    assert named in said and "not supported for target host" in said


def test_host_int16_report_names_int16(tmp_path: Path, config_path: Path) -> None:
    """A host `qtype: int16` compile's accuracy.json says `method: int16`, as its checkpoint says uint16 activations
    (it said int8)."""
    mf = det_manifest(tmp_path, target="host", qtype="int16", eval_samples=4)
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 0
    with zipfile.ZipFile(tmp_path / "det.saigeedge") as zf:
        assert json.loads(zf.read("accuracy.json"))["method"] == "int16"
    assert checkpoint(tmp_path / "det.saigeedge")["quantization"]["activations"] == "uint16"


@pytest.mark.parametrize(("fields", "text"), [
    ({"variants": [{"calibration_method": "entropy"}]},
     "`variants[0].calibration_method` must be one of ema, minmax, kl, normal, auto, got 'entropy'"),
    ({"variants": [{}, {"hybrid_topn": -1}]}, "`variants[1].hybrid_topn` must be >= 0, got -1"),
    ({"hybrid_dtype": "nonsense"}, "`hybrid_dtype` must be one of float16, dynamic_fixed_point-i16, bfloat16-bfloat16"),
    ({"variants": [{"hybrid_dtype": "nonsense"}]}, "`variants[0].hybrid_dtype` must be one of float16,"),
    ({"variants": [{"name": "x" * 5000}]}, "`variants[0].name` must be at most 120 characters, got 5000"),
    ({"variants": [{"name": "a\x1b[2Jb"}]}, "`variants[0].name` must not contain control characters"),
])
def test_variant_errors_name_the_variant(tmp_path: Path, fields: dict[str, Any], text: str) -> None:
    """A bad variant value is MANIFEST_INVALID naming `variants[i].field`; hybrid_dtype is checked against the
    values notes/pegasus.md knows; a variant's name is bounded and printable."""
    assert text in _refusal(det_manifest(tmp_path, target="cubie", **fields))

"""Quantization settings per target (SPEC §4, §17): what a target's compiler never receives is warned of, naming the
field (a variant's as `variants[i].field`); what is compiled is what the report names; bad variant values are
refused naming the variant."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from factory import checkpoint, det_manifest

from saigeedged import config as configmod
from saigeedged import manifest as manifestmod
from saigeedged.cli import main as cli
from saigeedged.errors import SaigeError


def _refusal(path: Path, defaults: dict[str, Any] | None = None) -> str:
    with pytest.raises(SaigeError) as err:
        manifestmod.load(path, defaults)
    assert err.value.code == "MANIFEST_INVALID"
    return err.value.message


@pytest.mark.parametrize(("target", "fields", "named"), [
    ("mobilint", {"variants": [{"calibration_method": "kl"}]}, "`variants[0].calibration_method` 'kl'"),
    ("mobilint", {"variants": [{"name": "a"}, {"qtype": "int16"}]}, "`variants[1].qtype` 'int16'"),
    ("mobilint", {"calibration_method": "minmax"}, "`calibration_method` 'minmax'"),
    ("mobilint", {"hybrid_topn": 2}, "`hybrid_topn` 2"),
    ("host", {"variants": [{"qtype": "float16"}]}, "`variants[0].qtype` 'float16'"),
    ("host", {"variants": [{"hybrid_topn": 2}]}, "`variants[0].hybrid_topn` 2"),
    ("host", {"variants": [{"quantizer": "qbfloat16"}]}, "`variants[0].quantizer` 'qbfloat16'"),
    ("host", {"qtype": "int8"}, "`qtype` 'int8'"),
])
def test_settings_a_target_never_receives_are_warned_of(tmp_path: Path, config_path: Path, capsys: Any, target: str,
                                                        fields: dict[str, Any], named: str) -> None:
    """A setting the target's compiler is never given (qbcompiler: no calibration method, qtype or hybrid layers;
    host: no float qtype, other quantizer or hybrid layers), top level or a variant's, is a warning of validate naming
    the field and why; the drop stays valid (exit 0): SPEC §17 has mobilint's emulation follow the manifest."""
    extra = {"device": "regulus-rb"} if target == "mobilint" else {}
    mf = det_manifest(tmp_path, target=target, **extra, **fields)
    assert cli.main(["validate", str(mf), "-c", str(config_path)]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if named in line]
    assert said and said[0].lstrip().startswith("warning") and f"has no effect for target {target}" in said[0], out
    assert ("qbcompiler is never given it" in said[0]) == (target == "mobilint")
    plain = det_manifest(tmp_path, target=target, **extra)
    assert cli.main(["validate", str(plain), "-c", str(config_path)]) == 0
    assert "has no effect" not in capsys.readouterr().out


def test_a_host_job_says_what_it_ignores_in_its_log(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """The job log says it too (and the compile succeeds): a host sweep whose hybrid variant compiles like the plain
    one is no longer two variants without a word."""
    mf = det_manifest(tmp_path, target="host", variants=[{"name": "plain"}, {"hybrid_topn": 2}])
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 0
    log = next((configmod.load(config_path).state_dir / "logs").iterdir()).read_text()
    assert "warning: `variants[1].hybrid_topn` 2 has no effect for target host" in log


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
    ({"hybrid_dtype": "nonsense"}, "`hybrid_dtype` must be float16 or <quantizer>-<qtype> as pegasus writes them "
     "(dynamic_fixed_point-i16, asymmetric_affine-u8), got 'nonsense'"),
    ({"variants": [{"hybrid_dtype": "nonsense"}]}, "`variants[0].hybrid_dtype` must be float16 or <quantizer>-<qtype>"),
    ({"hybrid_dtype": "int8"}, "`hybrid_dtype` must be float16 or <quantizer>-<qtype>"),
    ({"hybrid_dtype": "dynamic_fixed_point-i16: x"}, "`hybrid_dtype` must be float16 or <quantizer>-<qtype>"),
    ({"variants": [{"name": "x" * 5000}]}, "`variants[0].name` must be at most 120 characters, got 5000"),
    ({"variants": [{"name": "a\x1b[2Jb"}]}, "`variants[0].name` must not contain control characters"),
])
def test_variant_errors_name_the_variant(tmp_path: Path, fields: dict[str, Any], text: str) -> None:
    """A bad variant value is MANIFEST_INVALID naming `variants[i].field`; a hybrid_dtype of neither form pegasus
    writes is refused naming the form; a variant's name is bounded and printable."""
    assert text in _refusal(det_manifest(tmp_path, target="cubie", **fields))


@pytest.mark.parametrize("dtype", ["float16", "dynamic_fixed_point-i16", "dynamic_fixed_point-i8", "asymmetric_affine-u8",
                                   "perchannel_symmetric_affine-i8", "bfloat16-bfloat16"])
def test_any_quantizer_qtype_spelling_is_a_hybrid_dtype(tmp_path: Path, dtype: str) -> None:
    """hybrid_dtype takes float16 and any `<quantizer>-<qtype>` (notes/pegasus.md's form), top level or a variant's:
    a closed list of three refused spellings pegasus takes (dynamic_fixed_point-i8, asymmetric_affine-u8)."""
    mf = det_manifest(tmp_path, target="cubie", hybrid_topn=2, hybrid_dtype=dtype, variants=[{"hybrid_dtype": dtype}])
    assert manifestmod.load(mf)[0].hybrid_dtype == dtype

"""Pure planning of the cubie backend: argv lists, inputmeta patch, entropy ranking, NBG checks (SPEC §6)."""

from pathlib import Path

import pytest
import yaml

from saigeedged.compile.backends import cubie
from saigeedged.errors import SaigeError
from saigeedged.manifest import Entry

INPUTMETA = """%YAML 1.2
---
input_meta:
  databases:
  - path: dataset.txt
    type: TEXT
    ports:
    - lid: images_208
      category: image
      layout: nchw
      shape: [1, 3, 640, 640]
      preprocess:
        reverse_channel: true
        mean: [0, 0, 0]
        scale: [1.0, 1.0, 1.0]
        preproc_node_params:
          add_preproc_node: false
          preproc_type: IMAGE_RGB
"""


def entry(**fields: object) -> Entry:
    base = {"task": "detection", "num_classes": 3, "calib": Path("/c.json"), "onnx": Path("/m/best.onnx"),
            "stem": "best", "manifest": Path("/m/best.yml")}
    return Entry(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(("method", "algorithm"), [("ema", "moving_average"), ("minmax", "normal"), ("normal", "normal"),
                                                   ("kl", "kl_divergence"), ("auto", "auto")])
def test_algorithm_mapping(method: str, algorithm: str) -> None:
    """calibration_method maps to pegasus --algorithm."""
    argv = cubie.quantize_args("best", entry(calibration_method=method), 100)
    assert argv[argv.index("--algorithm") + 1] == algorithm


@pytest.mark.parametrize(("quantizer", "qtype", "postfix"), [
    ("asymmetric_affine", "uint8", "uint8"), ("dynamic_fixed_point", "int16", "int16"),
    ("perchannel_symmetric_affine", "int8", "pcq"), ("qbfloat16", "qbfloat16", "bf16"), ("float16", "float16", "fp16")])
def test_quantize_argv_and_postfix(quantizer: str, qtype: str, postfix: str) -> None:
    """The quantize call is the SPEC's argv, with the postfix of the quantizer."""
    argv = cubie.quantize_args("best_surgery", entry(quantizer=quantizer, qtype=qtype), 37)
    assert argv == ["quantize", "--model", "best_surgery.json", "--model-data", "best_surgery.data", "--device", "CPU",
                    "--with-input-meta", "best_surgery_inputmeta.yml", "--rebuild", "--model-quantize",
                    f"best_surgery_{postfix}.quantize", "--quantizer", quantizer, "--qtype", qtype,
                    "--algorithm", "moving_average", "--batch-size", "1", "--iterations", "37"]


def test_hybrid_argv() -> None:
    """hybrid_topn adds --compute-entropy, the second pass uses --hybrid, export takes the .quantize.json."""
    e = entry(hybrid_topn=2)
    first, second = cubie.quantize_args("n", e, 5), cubie.quantize_args("n", e, 5, hybrid=True)
    assert "--compute-entropy" in first and "--rebuild" in first
    assert "--hybrid" in second and "--rebuild" not in second and "--compute-entropy" not in second
    export = cubie.export_args("n", e, "/sdk")
    assert export[export.index("--model") + 1] == "n_uint8.quantize.json"
    assert cubie.steps(e)[-2:] == ["hybrid", "export"] and "hybrid" not in cubie.steps(entry())


@pytest.mark.parametrize(("platform", "optimize"), [("a733", "VIP9000NANODI_PLUS_PID0X1000003B"),
                                                    ("t527", "VIP9000NANOSI_PLUS_PID0X10000016"),
                                                    ("v853", "VIP9000PICO_PID0XEE")])
def test_export_argv(platform: str, optimize: str) -> None:
    """Export packs a unified NBG for the platform's target into wksp/NAME_Q/NAME_Q."""
    argv = cubie.export_args("best", entry(platform=platform), "/sdk")
    assert argv[:2] == ["export", "ovxlib"] and "--pack-nbg-unify" in argv
    assert argv[argv.index("--optimize") + 1] == optimize
    assert argv[argv.index("--output-path") + 1] == "wksp/best_uint8/best_uint8"
    assert argv[argv.index("--viv-sdk") + 1] == "/sdk"
    override = cubie.export_args("best", entry(platform=platform, optimize="VIP9000NANODI_PID0X1000003B"), "/sdk")
    assert override[override.index("--optimize") + 1] == "VIP9000NANODI_PID0X1000003B"


def test_patch_inputmeta() -> None:
    """The database points at the absolute dataset.txt; mean/scale fused; uint8 RGB preprocess node on."""
    text = cubie.patch_inputmeta(INPUTMETA, Path("/w/dataset.txt"), [123.675, 116.28, 103.53], [0.017, 0.0175, 0.0174])
    assert text.startswith("%YAML 1.2\n---\n") and "\t" not in text
    data = yaml.safe_load(text)
    db = data["input_meta"]["databases"][0]
    assert db["path"] == "/w/dataset.txt" and db["type"] == "TEXT"
    pre = db["ports"][0]["preprocess"]
    assert pre["mean"] == [123.675, 116.28, 103.53] and pre["scale"] == [0.017, 0.0175, 0.0174]
    assert pre["preproc_node_params"] == {"add_preproc_node": True, "preproc_type": "IMAGE_RGB"}
    assert db["ports"][0]["shape"] == [1, 3, 640, 640]


def test_entropy_ranking_skips_outputs() -> None:
    """The N highest-entropy tensors are chosen, never an @output tensor."""
    text = "@Conv_0:out0 0.12\n@output_0:out0 0.99\n@Conv_1:out0: 0.45\n@Sigmoid_3:out0 3e-1\n\nnoise line\n"
    assert cubie.rank_entropy(text, 2) == ["@Conv_1:out0", "@Sigmoid_3:out0"]
    assert cubie.rank_entropy(text, 10) == ["@Conv_1:out0", "@Sigmoid_3:out0", "@Conv_0:out0"]


def test_hybrid_layers_written() -> None:
    """customized_quantize_layers gets `<name>: <dtype>` lines; the rest of the file stays."""
    text = "quantize_parameters:\n  a: {qtype: uint8}\ncustomized_quantize_layers: {}\n"
    data = yaml.safe_load(cubie.add_hybrid_layers(text, ["@Conv_1:out0"], "float16"))
    assert data == {"quantize_parameters": {"a": {"qtype": "uint8"}}, "customized_quantize_layers": {"@Conv_1:out0": "float16"}}


def test_nbg_header_check() -> None:
    """VPMN magic and the platform's little-endian chip id at bytes 8-11."""
    a733 = b"VPMN" + (0x20000).to_bytes(4, "little") + (0x1000003B).to_bytes(4, "little")
    cubie.check_nbg(a733, "a733")
    with pytest.raises(SaigeError, match="0x1000003B") as err:
        cubie.check_nbg(a733, "t527")
    assert err.value.code == "NBG_INVALID"
    with pytest.raises(SaigeError, match="VPMN"):
        cubie.check_nbg(b"ELF\x00" + a733[4:], "a733")


def test_nbg_location(tmp_path: Path) -> None:
    """The NBG is at wksp/NAME_Q_nbg_unify/, else the only one under wksp/."""
    other = tmp_path / "wksp" / "elsewhere" / "network_binary.nb"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"x")
    assert cubie.locate_nbg(tmp_path, "best_uint8") == other
    expected = tmp_path / "wksp" / "best_uint8_nbg_unify" / "network_binary.nb"
    expected.parent.mkdir()
    expected.write_bytes(b"y")
    assert cubie.locate_nbg(tmp_path, "best_uint8") == expected


def test_fatal_code() -> None:
    """The export log's fatal line gives the generator's code."""
    assert cubie.fatal_code(b"I ...\nE Fatal model generation error: 65280\n") == 65280
    assert cubie.fatal_code(b"I Error(0),Warning(0)\n") is None

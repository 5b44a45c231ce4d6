"""Variant sweeps (SPEC §17): the steps each variant runs, what is compiled and published, what validate shows."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from factory import checkpoint, det_manifest

from saigeedged import manifest as manifestmod
from saigeedged.cli import main as cli
from saigeedged.compile import pipeline


def test_a_variant_adding_hybrid_layers_plans_the_hybrid_step(tmp_path: Path) -> None:
    """A cubie sweep whose variant adds hybrid_topn to a base without it plans cubie's `hybrid` step (it was planned
    from the base entry alone, and the variant's step failed INTERNAL `'hybrid' is not in list`)."""
    entry = manifestmod.load(det_manifest(tmp_path, target="cubie", variants=[{}, {"hybrid_topn": 3}]))[0]
    steps = pipeline.plan_steps(entry)
    assert steps[steps.index("quantize"):] == ["quantize", "hybrid", "export", "bundle", "publish"]


@pytest.mark.docker
def test_a_cubie_variant_adding_hybrid_layers_compiles_them(tmp_path: Path, docker_config: Path, capsys: Any) -> None:
    """The tester's case: cubie, cache false, `variants: [{hybrid_topn: 2}]` compiles, the bundle has the promoted
    layers and checkpoint.yaml says which variant it is; validate lists the variant and the hybrid step."""
    mf = det_manifest(tmp_path, target="cubie", cache=False, eval_samples=4, variants=[{"hybrid_topn": 2}])
    assert cli.main(["validate", str(mf), "-c", str(docker_config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  variants    1: each compiled and evaluated, the best that passes the gate published" in out
    assert "    1. hybrid_topn 2: hybrid_topn 2" in out
    assert any(line.startswith("  steps ") and " quantize hybrid export " in line for line in out), out
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    ckpt = checkpoint(tmp_path / "det.saigeedge")
    assert ckpt["quantization"]["hybrid_topn"] == 2 and len(ckpt["quantization"]["hybrid_layers"]) == 2
    assert ckpt["variant"] == {"index": 1, "of": 1, "name": "hybrid_topn 2", "overrides": {"hybrid_topn": 2},
                               "compared": False}
    with zipfile.ZipFile(tmp_path / "det.saigeedge") as zf:  # the emulation says what it leaves out (it said pegasus
        notes = json.loads(zf.read("accuracy.json"))["notes"]  # chose the layers: the daemon does)
    assert "hybrid_topn 2: the tensors promoted to float16 on the board (the job log's `hybrid` line, checkpoint.yaml's " \
           "hybrid_layers) are not emulated: quantized here like the rest" in notes, notes


def test_variants_without_a_report_compile_only_the_first(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """`eval_samples: 0`: the variants cannot be compared, so only the first is compiled and published; validate
    and the job log say so and checkpoint.yaml records which variant it is (all were compiled, variant 1 published
    without a word)."""
    mf = det_manifest(tmp_path, target="host", eval_samples=0,
              variants=[{"calibration_method": "minmax"}, {"name": "wide", "qtype": "int16"}])
    assert cli.main(["validate", str(mf), "-c", str(config_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  variants    2: only the first compiled" in out and "    2. wide: qtype int16" in out
    assert any(line.startswith("  warning     variants: no held-out image") for line in out), out
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 0
    ckpt = checkpoint(tmp_path / "det.saigeedge")
    assert ckpt["variant"] == {"index": 1, "of": 2, "name": "calibration_method minmax",
                               "overrides": {"calibration_method": "minmax"}, "compared": False}
    assert ckpt["quantization"]["calibration_method"] == "minmax"
    log = next((tmp_path / "state" / "logs").iterdir()).read_text()
    assert "the variants cannot be compared, so only the first is compiled and published" in log
    assert "variant 2/2" not in log and "variant 1/2 chosen: calibration_method minmax (published if it passes the gate)" in log


def test_variants_that_compile_the_same_model_are_evaluated_once(tmp_path: Path, config_path: Path,
                                                                  capsys: Any) -> None:
    """A host sweep whose second variant changes only hybrid layers (which the host target never gives its
    quantizer) compiles and evaluates it once with the first: the report's table has the distinct compiles, its notes
    and the job log name the one folded, validate says it; the mobilint case (every variant the same .mxq) failed or
    passed one artifact's gate by settings qbcompiler never ran."""
    sweep = [{"name": "plain"}, {"name": "hyb", "hybrid_topn": 2}, {"name": "wide", "qtype": "int16"}]
    mf = det_manifest(tmp_path, target="host", eval_samples=4, variants=sweep)
    assert cli.main(["validate", str(mf), "-c", str(config_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "    2. hyb: hybrid_topn 2 (compiles the same model as plain for target host (it changes only settings its " \
           "compiler is never given): compiled and evaluated once)" in out, out
    assert "    3. wide: qtype int16" in out
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 0
    with zipfile.ZipFile(tmp_path / "det.saigeedge") as zf:
        rep = json.loads(zf.read("accuracy.json"))
    assert [(r["name"], r.get("same_as")) for r in rep["variants"]] == [("plain", None), ("hyb", 1), ("wide", None)]
    assert {k: v for k, v in rep["variants"][1].items() if k not in ("variant", "name", "overrides", "same_as")} == \
        {k: v for k, v in rep["variants"][0].items() if k not in ("variant", "name", "overrides")}
    assert any(n.startswith("variant 2 (hyb) compiles the same model as plain") for n in rep["notes"]), rep["notes"]
    log = next((tmp_path / "state" / "logs").iterdir()).read_text()
    assert "variants: hyb compiles the same model as plain for target host" in log
    assert "variant 2/3" not in log and "variant 3/3: wide" in log and "(the same compile as 1)" in log


def test_every_mobilint_variant_is_one_compile() -> None:
    """Mobilint's qbcompiler is given no quantization setting: every variant folds into the first; cubie's are all
    its own compiles (a variant repeating another's settings folds there too)."""
    from saigeedged.compile import variants

    def entry(target: str, rows: list[dict[str, Any]]) -> Any:
        return manifestmod.Entry(task="detection", num_classes=3, calib=Path("c.json"), onnx=Path("m.onnx"), stem="m",
                                 manifest=Path("m.yml"), target=target, variants=rows)

    rows = [{"calibration_method": "minmax"}, {"name": "i16", "qtype": "int16"}, {"hybrid_topn": 2}]
    assert variants.folded(entry("mobilint", rows)) == {1: 0, 2: 0}
    assert variants.folded(entry("cubie", rows)) == {}
    assert variants.folded(entry("cubie", [*rows, {"name": "again", "calibration_method": "minmax"}])) == {3: 0}
    assert variants.folded(entry("host", [{"calibration_method": "minmax"}, {"calibration_method": "normal"}])) == {1: 0}

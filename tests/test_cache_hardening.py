"""The compile cache against inputs that must not be confused (SPEC §12): what the key must see, damaged entries."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from factory import classifier, manifest, random_labels, valjson

from saigeedged import cli


def external(path: Path, seed: int) -> bytes:
    """The classifier with weights of `seed`, saved with its weights in `<name>.data` beside it; the .onnx bytes."""
    classifier(path, 4, (64, 64), seed=seed)
    model = onnx.load(str(path))
    path.with_name(f"{path.name}.data").unlink(missing_ok=True)  # onnx.save appends to an existing data file
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=f"{path.name}.data",
              size_threshold=0)
    return path.read_bytes()


def compile_host(tmp_path: Path, config_path: Path, name: str, capsys: Any) -> tuple[str, bytes]:
    """`saigeedged compile` of tmp_path/ext.onnx for host; (stdout, the INT8 model in the bundle)."""
    if not (tmp_path / "data" / "val.json").exists():
        valjson(tmp_path / "data", random_labels(6, 4))
    out = tmp_path / f"{name}.saigeedge"
    mf = manifest(tmp_path / f"{name}.yml", task="mlc", num_classes=4, calib=str(tmp_path / "data" / "val.json"),
                  input_size=[64, 64], onnx="ext.onnx", target="host", output=str(out))
    assert cli.main(["compile", str(mf), "-c", str(config_path)]) == 0
    with zipfile.ZipFile(out) as zf:
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
        return capsys.readouterr().out, zf.read(ckpt["model"])


def test_other_external_weights_behind_the_same_onnx_bytes_miss(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """An ONNX whose weights live in an external data file: new weights behind byte-identical .onnx bytes are
    another compile (a miss and another INT8 model), never the cached artifact of the old weights."""
    before = external(tmp_path / "ext.onnx", seed=0)
    first_out, first = compile_host(tmp_path, config_path, "first", capsys)
    assert external(tmp_path / "ext.onnx", seed=1) == before  # only the .data file changed
    out, second = compile_host(tmp_path, config_path, "second", capsys)
    assert "cache hit" not in first_out and "cache hit" not in out and "quantize" in out
    assert second != first
    again_out, again = compile_host(tmp_path, config_path, "again", capsys)
    assert "cache hit" in again_out and again == second


@pytest.mark.docker
def test_another_viv_sdk_folder_is_another_compile(tmp_path: Path, docker_config: Path, capsys: Any,
                                                   det_inputs: dict[str, Any]) -> None:
    """cubie.viv_sdk is in the export's argv: after it changes, the same drop compiles again (here the new folder is
    missing, so the export fails as it must) instead of reusing what the old SDK made."""
    mf = manifest(tmp_path / "det.yml", **det_inputs["manifest"], onnx=str(det_inputs["onnx"]),
                  output=str(tmp_path / "det.saigeedge"))
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    assert "cache hit" not in capsys.readouterr().out
    data = yaml.safe_load(docker_config.read_text())
    data["cubie"]["viv_sdk"] = "/root/Vivante_IDE/VivanteIDE9.9.9/cmdtools"
    docker_config.write_text(yaml.safe_dump(data))
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 1
    out = capsys.readouterr().out
    assert "cache hit" not in out and "EXPORT_FAILED" in out

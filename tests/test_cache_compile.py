"""The cache through `saigeedged compile` on the host target (SPEC §12): hits, misses and what a bundle records."""

from __future__ import annotations

import hashlib
import importlib.metadata
import zipfile
from pathlib import Path
from typing import Any

import yaml
from factory import classifier, image, manifest, random_labels, valjson

from saigeedged import __version__
from saigeedged.cli import main as cli


def compile_cls(tmp_path: Path, config_path: Path, name: str, capsys: Any, **fields: Any) -> tuple[int, str, Path]:
    """Compile the shared classifier + calibration set under manifest `name`; (exit code, stdout, bundle)."""
    if not (tmp_path / "cls.onnx").exists():
        classifier(tmp_path / "cls.onnx", 4, (64, 64))
        valjson(tmp_path / "data", random_labels(6, 4))
    out = tmp_path / f"{name}.saigeedge"
    mf = manifest(tmp_path / f"{name}.yml", task="mlc", num_classes=4, calib=str(tmp_path / "data" / "val.json"),
                  input_size=[64, 64], onnx="cls.onnx", target="host", output=str(out), **fields)
    code = cli.main(["compile", str(mf), "-c", str(config_path)])
    return code, capsys.readouterr().out, out


def read(path: Path) -> tuple[dict[str, Any], bytes, str]:
    with zipfile.ZipFile(path) as zf:
        ckpt = yaml.safe_load(zf.read("checkpoint.yaml"))
        return ckpt, zf.read(ckpt["model"]), zf.read("calib_digests.txt").decode()


def test_identical_compile_hits_and_records_its_own_job(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """A second compile of the same model (other name, output, priority, runtime_overrides) reuses the first's INT8 model byte for
    byte, skips wrap/quantize/report, and its checkpoint names its own job with the same key and toolchain."""
    code, first_out, first = compile_cls(tmp_path, config_path, "first", capsys)
    assert code == 0 and "cache hit" not in first_out and "[3/7] first: wrap" in first_out
    code, out, second = compile_cls(tmp_path, config_path, "second", capsys, priority=5,
                                    runtime_overrides={"postprocess": {"threshold": 40.0}})
    assert code == 0 and "cache hit" in out and "wrap" not in out and "[3/4] second: bundle" in out
    a, model_a, digests_a = read(first)
    b, model_b, digests_b = read(second)
    assert model_a == model_b and b["model"] == "cls.int8.onnx"
    assert a["cache_key"] == b["cache_key"] and a["build"]["job_id"] != b["build"]["job_id"]
    assert b["build"]["job_id"].startswith("second-") and b["postprocess"] == {"threshold": 40.0}
    assert b["toolchain"] == {"onnxruntime": importlib.metadata.version("onnxruntime")}
    assert b["saigeedged_version"] == __version__ and b["input_channels"] == "rgb"
    assert b["quantization_report"] == a["quantization_report"]
    chosen = [line.split("  ", 1) for line in digests_b.splitlines()]
    assert digests_a == digests_b and len(chosen) == 6 and b["calib_digests"] == "calib_digests.txt"
    assert all(hashlib.sha256(Path(p).read_bytes()).hexdigest() == d for d, p in chosen)


def test_changed_calibration_image_misses(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """One calibration image with other bytes (same name) is another compile: a miss and another key."""
    assert compile_cls(tmp_path, config_path, "before", capsys)[0] == 0
    image(tmp_path / "data" / "images" / "img0003.jpg", seed=99)
    code, out, after = compile_cls(tmp_path, config_path, "after", capsys)
    assert code == 0 and "cache hit" not in out
    assert read(after)[0]["cache_key"] != read(tmp_path / "before.saigeedge")[0]["cache_key"]


def test_cache_false_in_the_manifest_compiles_again(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """`cache: false` compiles even when the cache holds the same compile; the key is still recorded."""
    assert compile_cls(tmp_path, config_path, "one", capsys)[0] == 0
    code, out, again = compile_cls(tmp_path, config_path, "two", capsys, cache=False)
    assert code == 0 and "cache hit" not in out and "wrap" in out
    assert read(again)[0]["cache_key"] == read(tmp_path / "one.saigeedge")[0]["cache_key"]


def test_eviction_at_max_bytes_makes_the_oldest_compile_a_miss(tmp_path: Path, config_path: Path, capsys: Any) -> None:
    """With room for one entry, a second compile evicts the first, which then compiles again (a miss)."""
    from saigeedged import config as configmod
    from saigeedged.adapters.cache import for_config

    assert compile_cls(tmp_path, config_path, "a", capsys, seed=1)[0] == 0
    (entry,) = for_config(configmod.load(config_path)).entries()
    data = yaml.safe_load(config_path.read_text())
    data["cache"] = {"max_bytes": entry.size * 3 // 2}
    config_path.write_text(yaml.safe_dump(data))
    assert compile_cls(tmp_path, config_path, "b", capsys, seed=2)[0] == 0
    keys = [e.key for e in for_config(configmod.load(config_path)).entries()]
    assert len(keys) == 1 and keys[0] != entry.key
    code, out, _ = compile_cls(tmp_path, config_path, "a_again", capsys, seed=1)
    assert code == 0 and "cache hit" not in out and "quantize" in out


def test_a_compile_as_root_leaves_nothing_the_service_cannot_write(tmp_path: Path, config_path: Path,
                                                                   capsys: Any) -> None:
    """`sudo saigeedged compile` with the service's config: its job log, its cache entry and the cache folder itself
    (the daemon had kept nothing yet) were root's in the service's state_dir, so the daemon's cache kept nothing more
    (a put into a root folder fails "not kept", silently) and could not evict them. They are the owner's when it ends;
    the bundle, where the manifest says, stays root's."""
    import os

    from saigeedged import config as configmod

    state = configmod.load(config_path).state_dir
    state.mkdir(parents=True, exist_ok=True)
    os.chown(state, 65534, 65534)  # the service's
    code, out, bundle = compile_cls(tmp_path, config_path, "asroot", capsys)
    assert code == 0 and bundle.stat().st_uid == 0, out
    made = [p for p in state.rglob("*") if "work" not in p.relative_to(state).parts]
    assert any(p.name == "cache" for p in made) and any(p.suffix == ".log" for p in made), made
    assert [p for p in made if p.lstat().st_uid == 0] == []

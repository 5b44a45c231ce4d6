"""The compile cache against inputs that must not be confused (SPEC §12): what the key must see, damaged entries."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from factory import classifier, manifest, random_labels, valjson
from harness import drop

from saigeedged.adapters.cache import Cache
from saigeedged.cli import main as cli


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
    """cubie.viv_sdk is in the export's argv: after it changes, the same drop compiles again instead of reusing what
    the old SDK made; a folder without the platform's .config fails CONTAINER_FAILED before any compiler step."""
    mf = manifest(tmp_path / "det.yml", **det_inputs["manifest"], onnx=str(det_inputs["onnx"]),
                  output=str(tmp_path / "det.saigeedge"))
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    assert "cache hit" not in capsys.readouterr().out
    data = yaml.safe_load(docker_config.read_text())
    data["cubie"]["viv_sdk"] = "/root/Vivante_IDE/VivanteIDE5.8.2/cmdtools"
    docker_config.write_text(yaml.safe_dump(data))
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 0
    assert "cache hit" not in capsys.readouterr().out
    data["cubie"]["viv_sdk"] = "/root/Vivante_IDE/VivanteIDE9.9.9/cmdtools"
    docker_config.write_text(yaml.safe_dump(data))
    assert cli.main(["compile", str(mf), "-c", str(docker_config)]) == 3
    captured = capsys.readouterr()
    assert "cache hit" not in captured.out and "CONTAINER_FAILED" in captured.err and ": import" not in captured.out


def stored(tmp_path: Path, key: str, payload: bytes) -> Cache:
    """A cache under tmp_path/state/cache holding `payload` as file m0 under `key`."""
    src = tmp_path / "work" / f"{key}.nb"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(payload)
    cache = Cache(tmp_path / "state" / "cache", 10_000)
    assert cache.put(key, {"m0": src}, {"source_job_id": f"job-{key}"})
    return cache


def test_an_entry_copied_under_another_key_is_no_hit(tmp_path: Path) -> None:
    """A folder whose meta.json names another key (copied or renamed by hand) is a miss, not that other compile."""
    cache = stored(tmp_path, "a" * 64, b"model of a")
    shutil.copytree(cache.root / ("a" * 64), cache.root / ("b" * 64))
    assert cache.get("b" * 64, tmp_path / "dest") is None
    assert cache.get("a" * 64, tmp_path / "dest") is not None


def test_a_file_name_leading_out_of_the_work_dir_is_no_hit(tmp_path: Path) -> None:
    """meta.json naming a file `../m0` (a damaged or tampered entry) is a miss and nothing is written beside the
    destination folder."""
    key = "c" * 64
    cache = stored(tmp_path, key, b"model")
    folder = cache.root / key
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"] = {"../m0": meta["files"]["m0"]}
    (folder / "meta.json").write_text(json.dumps(meta))
    shutil.copyfile(folder / "m0", cache.root / "m0")
    dest = tmp_path / "job" / "cached"
    assert cache.get(key, dest) is None and not (dest.parent / "m0").exists()


def test_the_cache_is_readable_by_the_daemon_user_only(tmp_path: Path) -> None:
    """The cache folder is 0700: it holds plain compiled models, also those whose bundles are encrypted."""
    (tmp_path / "state" / "cache").mkdir(parents=True, mode=0o755)
    cache = stored(tmp_path, "d" * 64, b"model")
    assert cache.root.stat().st_mode & 0o777 == 0o700


def test_a_tampered_member_name_is_a_miss_never_a_bundle_member(tmp_path: Path, config_path: Path,
                                                                capsys: Any) -> None:
    """meta.json whose member would be named `../evil.onnx` in the bundle: the next identical compile misses and
    compiles, and its bundle holds only plain member names."""
    from saigeedged import config as configmod
    from saigeedged.adapters.cache import for_config

    external(tmp_path / "ext.onnx", seed=0)
    compile_host(tmp_path, config_path, "first", capsys)
    (entry,) = for_config(configmod.load(config_path)).entries()
    meta = json.loads((entry.path / "meta.json").read_text())
    meta["members"] = [[stored, "/../evil.onnx", is_model] for stored, _, is_model in meta["members"]]
    (entry.path / "meta.json").write_text(json.dumps(meta))
    out, _ = compile_host(tmp_path, config_path, "second", capsys)
    assert "cache hit" not in out and "quantize" in out
    with zipfile.ZipFile(tmp_path / "second.saigeedge") as zf:
        assert not any(".." in name or "/" in name for name in zf.namelist())


def test_a_redrop_with_other_external_weights_misses_in_the_daemon(daemon: Any, tmp_path: Path) -> None:
    """Through the daemon (external data is claimed with its model): the same .onnx bytes dropped again with other
    weights in the data file compile again, and the two bundles hold different INT8 models."""
    d = daemon()
    valjson(tmp_path / "data", random_labels(6, 4))
    base = {"task": "mlc", "num_classes": 4, "input_size": [64, 64], "calib": str(tmp_path / "data" / "val.json")}
    src = tmp_path / "src" / "ext.onnx"
    src.parent.mkdir()
    docs, models = [], []
    for name, seed in (("one", 0), ("two", 1)):
        external(src, seed)
        (d.inbox / "ext.onnx.data").write_bytes(src.with_name("ext.onnx.data").read_bytes())
        drop(d.inbox, name, src, base)
        docs.append(d.wait_job(name))
        with zipfile.ZipFile(d.outbox / docs[-1]["bundle"]["path"]) as zf:
            models.append(zf.read(yaml.safe_load(zf.read("checkpoint.yaml"))["model"]))
    assert [doc["cache"]["hit"] for doc in docs] == [False, False] and docs[0]["cache"]["key"] != docs[1]["cache"]["key"]
    assert models[0] != models[1]


def test_a_write_into_a_taken_emulated_model_leaves_the_kept_one_alone(tmp_path: Path) -> None:
    """A report's emulated model is kept per compile (compile/emulated.py) and taken into the job's work folder, which
    the next job's steps share: a step writing into the taken file (not replacing it) must not change what every
    later report of that compile takes (it did when the file was a hard link of the kept one)."""
    from saigeedged.compile import emulated

    kept = emulated.path(tmp_path / "state", "k" * 64, "minmax", 8)
    assert kept is not None
    made = tmp_path / "made.onnx"
    made.write_bytes(b"the emulated model")
    emulated.keep(made, kept)
    work = tmp_path / "work"
    work.mkdir()
    taken = work / "det.emulated.onnx"
    assert emulated.take(kept, taken) and taken.read_bytes() == b"the emulated model"
    with taken.open("r+b") as fh:  # a step writing into the file in place
        fh.write(b"POISONED")
    assert [p.read_bytes() for p in kept.parent.glob("*.onnx")] == [b"the emulated model"]
    assert emulated.take(kept, work / "again.onnx") and (work / "again.onnx").read_bytes() == b"the emulated model"


@pytest.mark.parametrize("damage", ["truncated", "random bytes"])
def test_a_damaged_emulated_model_is_removed_and_made_again(tmp_path: Path, damage: str) -> None:
    """A kept emulated model whose bytes are no longer those kept (truncated, or other bytes of the same size) is not
    taken but removed, and the next keep is taken again (it was taken, and every later report of that compile ended
    INTERNAL "InvalidProtobuf" until `cache clear`)."""
    from saigeedged.compile import emulated

    slot = emulated.path(tmp_path / "state", "k" * 64, "ema", 8)
    assert slot is not None
    made = classifier(tmp_path / "made.onnx", 4, (64, 64))
    emulated.keep(made, slot)
    [kept] = slot.parent.iterdir()
    good = kept.read_bytes()
    kept.write_bytes(good[:len(good) // 2] if damage == "truncated" else os.urandom(len(good)))
    work = tmp_path / "work"
    work.mkdir()
    taken = work / "det.emulated.onnx"
    taken.write_bytes(b"a step's leftover")
    assert not emulated.take(slot, taken)
    assert not taken.exists() and not list(slot.parent.iterdir())  # the report quantizes into it afresh
    emulated.keep(made, slot)  # what the report made then
    assert emulated.take(slot, taken) and taken.read_bytes() == good


def test_an_unreadable_emulated_model_is_not_taken(tmp_path: Path) -> None:
    """A kept emulated model that cannot be read (a folder in its place here; EIO on a damaged disk) is not taken,
    and the report quantizes afresh (the copy's OSError ended the report child, the job with it)."""
    from saigeedged.compile import emulated

    slot = emulated.path(tmp_path / "state", "k" * 64, "ema", 8)
    assert slot is not None
    slot.parent.mkdir(parents=True)
    (slot.parent / f"{slot.name}.{'0' * 64}.onnx").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    assert not emulated.take(slot, work / "det.emulated.onnx")
    assert not (work / "det.emulated.onnx").exists()

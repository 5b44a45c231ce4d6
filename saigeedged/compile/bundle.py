"""The `.saigeedge` bundle (SPEC §7): checkpoint.yaml plus the compiled model, optionally AES-256 encrypted."""

from __future__ import annotations

import copy
import os
import shutil
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pyzipper
import yaml

from saigeedged import __version__, files
from saigeedged.errors import SaigeError
from saigeedged.profiles import mean_scale

if TYPE_CHECKING:
    from saigeedged.compile.backends import Artifact
    from saigeedged.compile.inputs import Prepared

SCHEMA_VERSION = 2


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`, mappings recursively, everything else replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def checkpoint(prep: Prepared, art: Artifact, job_id: str, created_at: str,
               made: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every field of checkpoint.yaml; `runtime_overrides` merged last. Never holds the password."""
    entry = prep.entry
    mean, scale = mean_scale(entry.profile)
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "task": entry.profile.bundle_task,
        "target": entry.target,
        "model": art.model_member,
        "input_layout": "nhwc_uint8",
        "normalize": False,
        "input_size": list(prep.input_size),
        "num_classes": entry.num_classes,
    }
    if prep.calib.class_names:
        data["class_names"] = list(prep.calib.class_names)
    data.update({
        "output_names": list(prep.info.output_names),
        "output_shapes": [list(s) for s in prep.info.output_shapes],
        "mean": [round(m, 6) for m in mean],
        "scale": [round(s, 8) for s in scale],
        "postprocess": dict(entry.profile.postprocess),
        "platform": art.platform,
        "quantization": art.quantization,
        "source": {"onnx": entry.onnx.name, "sha256": prep.onnx_sha256,
                   "surgery": list(prep.surgery) if prep.surgery else None},
        "build": {"job_id": job_id, "saigeedged": __version__, "image": art.image, "image_id": art.image_id,
                  "created_at": created_at},
        "encrypted": bool(entry.password),
    })
    data.update(made or {})  # toolchain, saigeedged_version, cache_key, input_channels (SPEC §12, §14)
    if art.report is not None:
        data["quantization_report"] = art.report
    return deep_merge(data, entry.runtime_overrides)


def write(dest: Path, data: dict[str, Any], members: Mapping[str, Path], password: str | None,
          texts: Mapping[str, str] | None = None, root: Path | None = None) -> None:
    """Write the zip by files.atomic_write (temp name, fsync, rename); `texts` stay unencrypted; each member read only
    as a regular file under `root` (the attempt's folder; by default its own folder), else EXPORT_FAILED."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(data, sort_keys=False)
    files.atomic_write(dest, lambda out: _zip(out, text, members, password, texts, root))


def not_taken(why: str) -> SaigeError:
    """EXPORT_FAILED: a compiler output is not bundled (nor cached), `why` in files.written_inside's words."""
    return SaigeError("EXPORT_FAILED", f"the compiler's output {why}", hint="a compiler step left something else "
                      "where its output belongs: check the image's tools, then `saigeedged retry JOB_ID`")


def _member(zf: pyzipper.AESZipFile, arcname: str, path: Path, root: Path | None) -> None:
    """One member, read from the file it was checked as (files.open_output), with its size, time and mode."""
    try:
        src = files.open_output(path, root)
    except files.NotOutput as exc:
        raise not_taken(f"{exc}: it is not bundled") from None
    with src:
        st = os.fstat(src.fileno())
        info = zf.zipinfo_cls(arcname, date_time=time.localtime(st.st_mtime)[:6])
        info.compress_type, info.external_attr, info.file_size = zipfile.ZIP_DEFLATED, (st.st_mode & 0xFFFF) << 16, \
            st.st_size
        with zf.open(info, "w") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def _zip(out: BinaryIO, text: str, members: Mapping[str, Path], password: str | None,
         texts: Mapping[str, str] | None, root: Path | None) -> None:
    with pyzipper.AESZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("checkpoint.yaml", text)  # stays readable: `unzip -p b.saigeedge checkpoint.yaml`
        for arcname, content in (texts or {}).items():
            zf.writestr(arcname, content)
        if password:
            zf.setpassword(password.encode())
            zf.setencryption(pyzipper.WZ_AES, nbits=256)
        for arcname, path in members.items():
            _member(zf, arcname, path, root)

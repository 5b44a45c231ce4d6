"""Answers for the stand-in's `pegasus inference` (tests/images/acuity): the float heads of a YOLOX-nano-shaped detector
(tests/realmodels.py) on each image, rounded to 256 levels as a quantized run would give them, as the `.tensor` text
the real simulator writes, under /standin/tensors/quantized/<md5 of the image>/ in the container."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

HEADS = ("/head/Concat_output_0", "/head/Concat_1_output_0", "/head/Concat_2_output_0")


def references(onnx_path: Path, folder: Path, size: int) -> bytes:
    """A tar of quantized/<md5 of the image>/attach_<head>_out0_<shape>.tensor for every image in `folder`."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from saigeedged.compile import images

    model = onnx.load(str(onnx_path))
    model.graph.output.extend([onnx.ValueInfoProto(name=n) for n in HEADS])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(folder.iterdir()):
            u8 = images.load_rgb(path, (size, size), letterbox=True)
            heads = sess.run(list(HEADS), {"images": (u8[..., ::-1].astype(np.float32) / 255).transpose(2, 0, 1)[None]})
            digest = hashlib.md5(path.read_bytes()).hexdigest()
            for head, value in zip(HEADS, heads, strict=True):
                step = max(float(value.max() - value.min()), 1e-12) / 255
                got = np.round((value - value.min()) / step) * step + value.min()
                text = "\n".join(f"{v:.6f}" for v in got.ravel()).encode() + b"\n"
                layer = head.strip("/").replace("/", "_")
                info = tarfile.TarInfo(f"quantized/{digest}/attach_{layer}_out0_{'_'.join(map(str, value.shape))}.tensor")
                info.size = len(text)
                tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


def put_references(ctr: Any, data: bytes) -> None:
    """The tar of references() into the container (docker-py's), where the stand-in looks."""
    ctr.exec_run(["mkdir", "-p", "/standin/tensors"])
    if not ctr.put_archive("/standin/tensors", data):
        raise RuntimeError("put_archive of the reference tensors failed")

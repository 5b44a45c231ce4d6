"""ONNX external data (SPEC §5): which files beside a model hold its weights, so they travel with the drop."""

from __future__ import annotations

import mmap
import os
from collections.abc import Container, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

# A model that keeps its weights outside is small itself (the graph only); a larger one is not read by the
# scanner, which runs in the daemon's main loop: its external data, if any, then stays behind and validate says so.
PROBE_BYTES = 32 << 20


def locations(model: Path) -> list[str]:
    """The `location`s of the model's external tensors, read without loading any weight ([] when unreadable).

    Only models that name a `location` (may_name_files) are parsed: most keep their weights inside and are never
    parsed here (the scanner runs in the main loop)."""
    try:
        if model.stat().st_size > PROBE_BYTES or not may_name_files(model):
            return []
        import onnx  # here, not at the top: onnx (ml_dtypes) is 0.7 s of every daemon start, and most models never
        # get this far

        return tensor_locations(onnx.load(str(model), load_external_data=False))
    except Exception:  # not ours to judge here: validate checks the model and names the problem
        return []


def may_name_files(model: Path) -> bool:
    """Can the model have external data? Every external tensor's entry holds the key `location`: a file without
    those bytes has none, and is never parsed (mapped, not read: a large model costs no memory here)."""
    with model.open("rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return False
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(b"location") >= 0


def tensor_locations(proto: onnx.ModelProto) -> list[str]:
    """The external-data `location`s of a model loaded without its external data."""
    import onnx

    found: set[str] = set()
    tensors = list(proto.graph.initializer) + [a.t for n in proto.graph.node for a in n.attribute if a.HasField("t")]
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            found.update(e.value for e in tensor.external_data if e.key == "location")
    return sorted(found)


def beside(model: Path, location: str) -> Path | None:
    """The file an external-data `location` of `model` names, when it is in the model's folder (None: outside it)."""
    path = Path(os.path.normpath(model.parent / location))
    return path if path.is_relative_to(model.parent) else None


def external_data(models: Iterable[Path], files: Container[Path]) -> list[Path]:
    """The inbox files the models name as external data; a location outside the model's folder is never taken."""
    taken: set[Path] = set()
    for model in models:
        for location in locations(model):
            path = beside(model, location)
            if path is not None and path in files:
                taken.add(path)
    return sorted(taken)

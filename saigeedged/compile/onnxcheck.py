"""ONNX checks (SPEC §5): load, checker, one input, static output shapes, and the YOLOX output-cut surgery."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from saigeedged import external
from saigeedged.errors import SaigeError

if TYPE_CHECKING:  # onnx itself is imported where a model is read: the daemon imports this module, and onnx (with
    import onnx  # ml_dtypes) is 0.7 s of every start, for models that are read in the children


@dataclass(frozen=True)
class ModelInfo:
    """What the rest of the pipeline needs to know about a (cut) model."""

    path: Path
    input_name: str
    input_shape: tuple[int | str, ...]
    output_names: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]

    @property
    def input_hw(self) -> tuple[int, int] | None:
        """(H, W) of an NCHW input when both are static."""
        if len(self.input_shape) == 4 and all(isinstance(d, int) and d > 0 for d in self.input_shape[2:]):
            return int(self.input_shape[2]), int(self.input_shape[3])
        return None


def _dims(value_info: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    dims: list[int | str] = []
    for dim in value_info.type.tensor_type.shape.dim:
        kind = dim.WhichOneof("value")
        dims.append(dim.dim_value if kind == "dim_value" else (dim.dim_param if kind == "dim_param" else "?"))
    return tuple(dims)


def load(path: Path, weights: bool = True) -> onnx.ModelProto:
    """Load and check a model (external data next to it is fine).

    `weights=False` leaves external data on disk (the checker still reads and bounds-checks it by path): what
    validation needs, at the memory of the graph and its embedded tensors only.
    """
    if not path.is_file():
        raise SaigeError("INPUT_NOT_FOUND", f"ONNX file {path} not found")
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=weights and _utf8(str(path)))
        if _utf8(str(path)):
            onnx.checker.check_model(str(path))
        elif external.tensor_locations(model):
            raise SaigeError("ONNX_INVALID", f"{path.name}: a model with external data needs a UTF-8 file name",
                             hint="rename the ONNX (letters, digits, `.`, `_`, `-`)")
        else:  # onnx's C++ checker takes UTF-8 paths only; the loaded model is checked instead
            onnx.checker.check_model(model)
    except (MemoryError, SaigeError):
        raise  # MemoryError: the child's memory bound, which child.run names
    except Exception as exc:  # onnx raises many types: DecodeError, ValidationError, OSError
        raise SaigeError("ONNX_INVALID", f"{path.name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    return model


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def describe(model: onnx.ModelProto, path: Path) -> ModelInfo:
    """Check one input and fully static outputs; return the model's shapes."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs)
        raise SaigeError("ONNX_INVALID", f"{path.name}: the model must have exactly one input, it has {len(inputs)} ({names})",
                         hint="export a single image input; other inputs must be constants")
    shapes = []
    for out in model.graph.output:
        dims = _dims(out)
        symbolic = [d for d in dims if isinstance(d, str)]
        if symbolic or not dims:
            raise SaigeError("SYMBOLIC_DIM", f"{path.name}: output `{out.name}` has the symbolic dimension "
                             f"`{symbolic[0] if symbolic else 'unknown rank'}` (shape {list(dims)})")
        shapes.append(tuple(int(d) for d in dims))
    return ModelInfo(path, inputs[0].name, _dims(inputs[0]), tuple(o.name for o in model.graph.output), tuple(shapes))


def check_input_size(info: ModelInfo, wanted: tuple[int, int] | None) -> tuple[int, int]:
    """The (H, W) to compile at: the manifest's or the ONNX's, which must agree when both are static."""
    dims = info.input_shape
    if len(dims) != 4:
        raise SaigeError("ONNX_INVALID", f"{info.path.name}: input `{info.input_name}` must be NCHW, got {list(dims)}")
    symbolic = [d for d in dims if isinstance(d, str)]
    if symbolic:
        raise SaigeError("SYMBOLIC_DIM", f"{info.path.name}: input `{info.input_name}` has the symbolic dimension "
                         f"`{symbolic[0]}` (shape {list(dims)})")
    static = info.input_hw
    if wanted and static and wanted != static:
        raise SaigeError("INPUT_SIZE_MISMATCH", f"input_size {list(wanted)} does not match the ONNX input "
                         f"`{info.input_name}` {list(dims)}")
    size = wanted or static
    if size is None:
        raise SaigeError("MANIFEST_INVALID", "`input_size` is required: the ONNX input has no static H, W")
    return size


def cut_outputs(model: onnx.ModelProto, path: Path, names: tuple[str, ...], dest: Path) -> onnx.ModelProto:
    """Make `names` the graph outputs, drop everything after them, save to `dest` (SPEC §5)."""
    produced = {o for node in model.graph.node for o in node.output}
    missing = [n for n in names if n not in produced]
    if missing:
        raise SaigeError("SURGERY_OUTPUTS_NOT_FOUND", f"{path.name}: no tensor named {', '.join(missing)}")
    import onnx
    from onnx import shape_inference, utils

    inferred = shape_inference.infer_shapes(model)
    initializers = {init.name for init in inferred.graph.initializer}
    inputs = [i.name for i in inferred.graph.input if i.name not in initializers]
    cut = utils.Extractor(inferred).extract_model(inputs, list(names))
    cut.ir_version = model.ir_version
    del cut.opset_import[:]
    cut.opset_import.extend(model.opset_import)
    if dest.exists():
        dest.unlink()  # never append to a stale file
    onnx.save(cut, str(dest))
    return cut

"""The cubie target (SPEC §6): ACUITY pegasus steps planned as argv lists, inputmeta patch, hybrid, NBG checks."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from saigeedged.compile import vivsdk
from saigeedged.compile.backends import Artifact, Context
from saigeedged.compile.backends.steps import StepRunner, read_output, rewrite
from saigeedged.errors import FATAL_HINTS, SaigeError
from saigeedged.profiles import PLATFORMS, TARGET_CANDIDATES, mean_scale

if TYPE_CHECKING:
    from saigeedged.adapters.docker import Container
    from saigeedged.compile.inputs import Prepared
    from saigeedged.config import Config
    from saigeedged.manifest import Entry

ALGORITHMS = {"ema": "moving_average", "minmax": "normal", "normal": "normal", "kl": "kl_divergence", "auto": "auto"}
POSTFIX = {"asymmetric_affine": "uint8", "dynamic_fixed_point": "int16", "perchannel_symmetric_affine": "pcq",
           "qbfloat16": "bf16", "float16": "fp16"}
PROBE = "command -v pegasus || ls /root/acuity-toolkit-whl-*/bin/pegasus.py"
NBG_MAGIC = b"VPMN"
FATAL_RE = re.compile(rb"Fatal model generation error: (-?\d+)")
MIN_QUANTIZE_BYTES = 64  # a ~30 byte .quantize means calibration silently failed
# notes/pegasus.md "Wave 3 facts": on an A733 board an FP16 NBG ran ~29x slower than INT16 (the NANO-DI MAC arrays
# are integer only) and INT16 kept the accuracy: dynamic_fixed_point-i16 is the accuracy path there
FP16_WARNING = "A733 runs FP16 ~29x slower than INT16: use qtype int16 / dynamic_fixed_point-i16 hybrid"


def steps(entry: Entry) -> list[str]:
    return ["import", "inputmeta", "postprocess", "patch", "quantize"] + (["hybrid"] if entry.hybrid_topn else []) + ["export"]


def optimize_target(entry: Entry) -> str:
    """The target before any look at the image: the manifest's `optimize:`, else the platform's first candidate."""
    return entry.optimize or PLATFORMS[entry.platform][0]


@dataclass(frozen=True)
class Target:
    """The --optimize target a job passes and how it was chosen (checkpoint.yaml `platform`, the job log)."""

    name: str
    source: str  # "manifest": its optimize:, never probed | "image": the first candidate the image has a .config for
    candidates: tuple[str, ...] = ()

    def platform(self, platform: str) -> dict[str, Any]:
        """checkpoint.yaml's `platform` mapping."""
        out: dict[str, Any] = {"name": platform, "optimize": self.name, "optimize_source": self.source}
        return out | ({"optimize_candidates": list(self.candidates)} if self.candidates else {})

    def describe(self, viv_sdk: str) -> str:
        if self.source == "manifest":
            return f"optimize: {self.name} (the manifest's optimize:, not looked up in the image)"
        return (f"optimize: {self.name} (the first of {', '.join(self.candidates)} with a .config in "
                f"{viv_sdk}/common/cfg)")


def choose_target(entry: Entry, ctr: Container, viv_sdk: str) -> Target:
    """The --optimize target for this entry in this container's image, probed once per container start.

    notes/pegasus.md "Wave 3 facts": Allwinner's pegasus_setup.sh v3 spells the A733 target
    VIP9000NANODI_PLUS_PID0X1000003B, while three board-verified A733 ports used the VIP9000NANODI_PID0X1000003B
    .config that ubuntu-npu:v2.0.10.x ships; which one v2.0.10.1 carries is unverified. So the image decides: the
    first of the platform's candidates (profiles.TARGET_CANDIDATES) whose `<name>.config` is in the VIV SDK.
    """
    if entry.optimize:  # the operator's word wins and is passed as written
        return Target(entry.optimize, "manifest")
    candidates = TARGET_CANDIDATES[entry.platform]
    found = ctr.entry_point(f"optimize:{entry.platform}", vivsdk.choose_script(viv_sdk, candidates))
    if found:
        return Target(found, "image", candidates)
    cfg = f"{viv_sdk}/common/cfg"
    have = vivsdk.targets(ctr.probe(vivsdk.list_script(viv_sdk))[1])
    raise SaigeError("CONTAINER_FAILED", f"image {ctr.spec.image} has no .config for platform {entry.platform}: "
                     f"none of {', '.join(f'{c}.config' for c in candidates)} in {cfg} "
                     f"(it has {', '.join(have) or 'no .config files'})",
                     hint="set cubie.viv_sdk to the image's VivanteIDE<ver>/cmdtools folder, or `optimize:` in the "
                     "manifest to a target the image has (`saigeedged check` lists them)")


def versions(ctr: Container, config: Config) -> dict[str, str | None]:
    """The ACUITY and VivanteIDE versions in this container's image (folder names), probed once per start."""
    text = ctr.entry_point("cubie-versions", vivsdk.version_script(config.cubie.viv_sdk))
    found = vivsdk.versions(text)
    if found["acuity"] is None and config.cubie.pegasus != "auto":  # a configured entry point may name its wheel
        found["acuity"] = vivsdk.versions(config.cubie.pegasus)["acuity"]
    return found


def precision_warnings(entry: Entry) -> list[str]:
    """The FP16 warning for a cubie a733 entry asking for float16 layers (all of them, or hybrid ones)."""
    if entry.target != "cubie" or entry.platform != "a733":
        return []
    asks = []
    if entry.quantizer == "float16" or entry.qtype == "float16":
        asks.append(f"quantizer {entry.quantizer} / qtype {entry.qtype}")
    if entry.hybrid_topn > 0 and entry.hybrid_dtype.split("-")[0] == "float16":
        asks.append(f"hybrid_dtype {entry.hybrid_dtype} for hybrid_topn {entry.hybrid_topn}")
    return [f"{FP16_WARNING} (the manifest asks for {' and '.join(asks)})"] if asks else []


def quantized_name(name: str, entry: Entry) -> str:
    return f"{name}_{POSTFIX[entry.quantizer]}"


def import_args(name: str) -> list[str]:
    return ["import", "onnx", "--model", f"{name}.onnx", "--output-model", f"{name}.json", "--output-data", f"{name}.data"]


def inputmeta_args(name: str) -> list[str]:
    return ["generate", "inputmeta", "--model", f"{name}.json", "--separated-database",
            "--input-meta-output", f"{name}_inputmeta.yml"]


def postprocess_args(name: str) -> list[str]:
    return ["generate", "postprocess-file", "--model", f"{name}.json",
            "--postprocess-file-output", f"{name}_postprocess_file.yml"]


def quantize_args(name: str, entry: Entry, iterations: int, *, hybrid: bool = False) -> list[str]:
    argv = ["quantize", "--model", f"{name}.json", "--model-data", f"{name}.data", "--device", "CPU",
            "--with-input-meta", f"{name}_inputmeta.yml", "--hybrid" if hybrid else "--rebuild",
            "--model-quantize", f"{quantized_name(name, entry)}.quantize", "--quantizer", entry.quantizer,
            "--qtype", entry.qtype, "--algorithm", ALGORITHMS[entry.calibration_method],
            "--batch-size", "1", "--iterations", str(iterations)]
    if entry.hybrid_topn and not hybrid:
        argv.append("--compute-entropy")
    return argv


def export_args(name: str, entry: Entry, viv_sdk: str, target: str | None = None) -> list[str]:
    q = quantized_name(name, entry)
    model = f"{q}.quantize.json" if entry.hybrid_topn else f"{name}.json"
    return ["export", "ovxlib", "--model", model, "--model-data", f"{name}.data", "--dtype", "quantized",
            "--model-quantize", f"{q}.quantize", "--target-ide-project", "linux64",
            "--with-input-meta", f"{name}_inputmeta.yml", "--postprocess-file", f"{name}_postprocess_file.yml",
            "--output-path", f"wksp/{q}/{q}", "--batch-size", "1", "--pack-nbg-unify",
            "--optimize", target or optimize_target(entry), "--viv-sdk", viv_sdk]


def patch_inputmeta(text: str, dataset: Path, mean: list[float], scale: list[float], channels: str = "rgb") -> str:
    """Point the database at dataset.txt and fuse mean/scale with a uint8 RGB preprocess node (step `patch`);
    a model trained on BGR gets reverse_channel so the board still feeds RGB (SPEC §14)."""
    header = "%YAML 1.2\n---\n" if text.lstrip().startswith("%YAML") else ""
    data = yaml.safe_load(text)
    database = data["input_meta"]["databases"][0]
    database["path"] = str(dataset)
    database["type"] = "TEXT"
    pre = database["ports"][0].setdefault("preprocess", {})
    pre["reverse_channel"] = channels == "bgr"
    pre["mean"] = [float(m) for m in mean]
    pre["scale"] = [float(s) for s in scale]
    node = pre.setdefault("preproc_node_params", {})
    node["add_preproc_node"] = True
    node["preproc_type"] = "IMAGE_RGB"
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)


def rank_entropy(text: str, top_n: int) -> list[str]:
    """The `top_n` tensors with the highest entropy (worst quantized), never an @output tensor."""
    rows = []
    for line in text.splitlines():
        match = re.match(r"^\s*(\S+?)\s*[:\s]\s*(-?[0-9.]+(?:[eE][-+]?\d+)?)\s*$", line)
        if match and not match.group(1).startswith("@output"):
            rows.append((float(match.group(2)), match.group(1)))
    rows.sort(key=lambda r: (-r[0], r[1]))
    return [name for _, name in rows[:top_n]]


def add_hybrid_layers(text: str, layers: list[str], dtype: str) -> str:
    """The .quantize file with `customized_quantize_layers` set to `<name>: <dtype>` for each layer."""
    data = yaml.safe_load(text) or {}
    data["customized_quantize_layers"] = {name: dtype for name in layers}
    return yaml.safe_dump(data, sort_keys=False)


def locate_nbg(work: Path, q: str) -> Path:
    """wksp/<q>_nbg_unify/network_binary.nb, else the only network_binary.nb under wksp/."""
    expected = work / "wksp" / f"{q}_nbg_unify" / "network_binary.nb"
    if expected.is_file():
        return expected
    found = sorted((work / "wksp").rglob("network_binary.nb"))
    if len(found) != 1:
        raise SaigeError("NBG_INVALID", f"export wrote {len(found)} network_binary.nb files under wksp/, expected one "
                         f"at {expected.relative_to(work)}")
    return found[0]


def check_nbg(header: bytes, platform: str) -> None:
    """The NBG starts with VPMN and carries the platform's chip id (bytes 8-11, little-endian)."""
    chip = PLATFORMS[platform][1]
    if header[:4] != NBG_MAGIC:
        raise SaigeError("NBG_INVALID", f"network_binary.nb does not start with VPMN (got {header[:4]!r})")
    found = int.from_bytes(header[8:12], "little")
    if found != chip:
        raise SaigeError("NBG_INVALID", f"network_binary.nb targets chip 0x{found:X}, platform {platform} needs 0x{chip:X}")


def fatal_code(output: bytes) -> int | None:
    match = FATAL_RE.search(output)
    return int(match.group(1)) if match else None


def pegasus_prefix(found: str) -> list[str]:
    """argv prefix from the probe's answer: a pegasus executable, or pegasus.py run by the image's python3."""
    return ["python3", found] if found.endswith(".py") else [found]


class Runner(StepRunner):
    """pegasus calls: the entry point probed once per container start; fatal export lines mapped."""

    def __init__(self, ctx: Context, ctr: Container, work: Path) -> None:
        setting = ctx.config.cubie.pegasus
        if setting == "auto":
            found = ctr.entry_point("pegasus", PROBE)
            if not found:
                raise SaigeError("CONTAINER_FAILED", f"no pegasus in image {ctr.spec.image} ({ctr.probe_failure})",
                                 hint="set cubie.pegasus to the entry point, "
                                 "e.g. `python3 /root/acuity-toolkit-whl-6.30.22/bin/pegasus.py`")
            prefix = pegasus_prefix(found)
        else:
            prefix = shlex.split(setting)
        super().__init__(ctx, ctr, work, prefix, "pegasus")

    def __call__(self, args: list[str]) -> bytes:
        """Run one pegasus call; returns its output (also streamed to the job log)."""
        code, output = self.call(args)
        fatal = fatal_code(output)
        if fatal is not None:
            raise SaigeError("EXPORT_FAILED", f"Fatal model generation error: {fatal}",
                             hint=FATAL_HINTS.get(fatal, "see the job log for the NBG generator's output"))
        if code != 0:
            raise self.failed(args, code, output)
        return output


def _quantize(run: Runner, prep: Prepared, iterations: int, hybrid: bool = False) -> Path:
    q = quantized_name(prep.name, prep.entry)
    path = prep.work_dir / f"{q}.quantize"
    run(quantize_args(prep.name, prep.entry, iterations, hybrid=hybrid))
    produced = path.with_name(f"{q}.quantize.json") if hybrid else path
    if not produced.is_file() or produced.stat().st_size < MIN_QUANTIZE_BYTES:
        raise SaigeError("QUANTIZE_NO_OUTPUT", f"quantize exited 0 but {produced.name} is "
                         f"{'missing' if not produced.is_file() else 'empty'} ({prep.entry.quantizer}/{prep.entry.qtype})")
    return path


def compile(prep: Prepared, ctx: Context) -> Artifact:
    """Run the pegasus steps; the bundle member is `<stem>.nb`."""
    assert ctx.container is not None
    entry, work, name = prep.entry, prep.work_dir, prep.name
    ctx.step("import")
    ctr = ctx.container("cubie")
    run = Runner(ctx, ctr, work)
    run(import_args(name))
    ctx.step("inputmeta")
    run(inputmeta_args(name))
    ctx.step("postprocess")
    run(postprocess_args(name))
    ctx.step("patch")
    meta = work / f"{name}_inputmeta.yml"
    mean, scale = mean_scale(entry.profile)
    assert prep.dataset is not None
    dataset = prep.dataset.resolve()
    rewrite(meta, work, lambda text: patch_inputmeta(text, dataset, mean, scale, entry.channels))
    ctx.step("quantize")
    quantize_file = _quantize(run, prep, len(prep.chosen))
    hybrid: list[str] = []
    if entry.hybrid_topn:
        ctx.step("hybrid")
        hybrid = rank_entropy(read_output(work / "entropy.txt", work), entry.hybrid_topn)
        ctx.log.line(f"hybrid: promoting {len(hybrid)} tensor(s) to {entry.hybrid_dtype}: {', '.join(hybrid)}")
        rewrite(quantize_file, work, lambda text: add_hybrid_layers(text, hybrid, entry.hybrid_dtype))
        _quantize(run, prep, len(prep.chosen), hybrid=True)
    ctx.step("export")
    target = choose_target(entry, ctr, ctx.config.cubie.viv_sdk)  # probed before the cache key: no probe here
    run(export_args(name, entry, ctx.config.cubie.viv_sdk, target.name))
    nbg = locate_nbg(work, quantized_name(name, entry))
    with nbg.open("rb") as fh:
        check_nbg(fh.read(12), entry.platform)
    quant: dict[str, Any] = {"quantizer": entry.quantizer, "qtype": entry.qtype,
                             "algorithm": ALGORITHMS[entry.calibration_method], "n_samples": len(prep.chosen),
                             "seed": entry.seed, "hybrid_topn": entry.hybrid_topn}
    if hybrid:
        quant["hybrid_dtype"], quant["hybrid_layers"] = entry.hybrid_dtype, hybrid
    member = f"{name}.nb"
    return Artifact(member, {member: nbg}, quant, platform=target.platform(entry.platform),
                    image=ctr.spec.image, image_id=ctr.image_id)

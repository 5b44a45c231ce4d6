"""A compile through the cache (SPEC §12): the key decided before any compiler step, a hit reused, a success kept."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saigeedged import __version__, cachekey, external, jobid
from saigeedged.adapters import cache
from saigeedged.compile import backends, bundle
from saigeedged.compile.backends import Artifact, Context
from saigeedged.compile.inputs import Prepared
from saigeedged.config import Config
from saigeedged.errors import SaigeError
from saigeedged.files import sha256_file, written_inside

# Host-side libraries that shape what the compiler is given: onnx cuts the model (surgery) and wraps it (host),
# Pillow and numpy decode and preprocess the calibration images (host, mobilint)
HOST_LIBRARIES = ("onnx", "pillow", "numpy")

CALIB_MEMBER = "calib_digests.txt"


@dataclass
class Made:
    """A compile's artifact and what made it: its key, hit or not, the toolchain, the calibration digests."""

    art: Artifact
    key: str
    hit: bool
    source_job_id: str | None
    toolchain: dict[str, Any]
    calib_rows: list[tuple[str, str]]

    def status(self) -> dict[str, Any]:
        """The status file's `cache` field."""
        return {"hit": self.hit, "key": self.key, "source_job_id": self.source_job_id}

    def checkpoint(self, prep: Prepared) -> dict[str, Any]:
        """What checkpoint.yaml records about how the bundle was made."""
        return {"toolchain": self.toolchain, "saigeedged_version": __version__, "cache_key": self.key,
                "input_channels": prep.entry.channels, "calib_digests": CALIB_MEMBER}

    def texts(self) -> dict[str, str]:
        """Text members of the bundle (stored unencrypted, like checkpoint.yaml)."""
        return {CALIB_MEMBER: cachekey.calib_digests_text(self.calib_rows)}


def toolchain(target: str, ctx: Context) -> dict[str, Any]:
    """The compiler's identity: the image the target's container runs (reference and ID) and the versions of the
    vendor tools in it (ACUITY and VivanteIDE, or qb Compiler), or onnxruntime's version."""
    if target == "host":
        return {"onnxruntime": importlib.metadata.version("onnxruntime")}
    from saigeedged.compile.backends import cubie, mobilint

    assert ctx.container is not None
    ctr = ctx.container(target)
    found = cubie.versions(ctr, ctx.config) if target == "cubie" else {"qbcompiler": mobilint.version(ctr)}
    return {"image": ctr.spec.image, "image_id": ctr.image_id, **found}


def decided(prep: Prepared, ctx: Context) -> dict[str, Any]:
    """What the image decides before any compiler step: cubie's --optimize target (in the key, and in the job log)."""
    from saigeedged.compile.backends import cubie

    if prep.entry.target != "cubie":
        return {}
    assert ctx.container is not None
    target = cubie.choose_target(prep.entry, ctx.container("cubie"), ctx.config.cubie.viv_sdk)
    ctx.log.line(target.describe(ctx.config.cubie.viv_sdk))
    return {"optimize": target.name}


def resolved(prep: Prepared, chosen: dict[str, Any] | None = None) -> dict[str, Any]:
    """The compile-relevant values the inputs, profiles and (`chosen`, see decided) the image decide."""
    from saigeedged.compile.backends import cubie, mobilint

    entry = prep.entry
    values: dict[str, Any] = {"input_size": list(prep.input_size), "input_channels": entry.channels,
                              "surgery_outputs": list(prep.surgery) if prep.surgery else None}
    if entry.target == "cubie":
        values["optimize"] = (chosen or {}).get("optimize") or cubie.optimize_target(entry)
    if entry.target == "mobilint":
        values["preset"] = mobilint.preset(entry)
    return values


def host_side(target: str, config: Config) -> dict[str, Any]:
    """What else decides the artifact besides the compiler image: the host libraries that prepare its inputs and,
    for cubie, the daemon's choice of pegasus entry point and VIV SDK folder inside the image (both in its argv)."""
    from saigeedged.compile.backends import mobilint

    found: dict[str, Any] = {name: importlib.metadata.version(name) for name in HOST_LIBRARIES}
    if target == "cubie":
        found.update(pegasus=config.cubie.pegasus, viv_sdk=config.cubie.viv_sdk)
    if target == "mobilint":  # qbcompiler's --device: cpu and gpu need not compute the same numbers
        found.update(device=mobilint.compile_device(config.mobilint.device, config.mobilint.image))
    return found


def external_data(path: Path) -> list[tuple[str, str]]:
    """(location, sha256) of each external data file the ONNX names: its weights, which its own digest misses."""
    if not external.may_name_files(path):
        return []  # most models: neither onnx imported into the daemon (0.7 s, 50 MB) nor the model parsed in it
    import onnx

    names = external.tensor_locations(onnx.load(str(path), load_external_data=False))
    return [(name, sha256_file(path.parent / name)) for name in names]


def key_inputs(prep: Prepared, tools: dict[str, Any], config: Config, rows: list[tuple[str, str]],
               chosen: dict[str, Any] | None = None) -> cachekey.KeyInputs:
    """The key's inputs of a prepared job compiled with `tools` (see cachekey; rows: the calibration digests;
    chosen: what the image decided, see decided)."""
    onnx_id = prep.onnx_sha256
    data = external_data(prep.entry.onnx)
    if data:
        onnx_id = cachekey.canonical({"onnx": onnx_id, "external_data": data})
    return cachekey.KeyInputs(onnx_id, cachekey.compile_fields(prep.entry, resolved(prep, chosen)), [d for d, _ in rows],
                              {**tools, "host": host_side(prep.entry.target, config)}, __version__)


def _meta(art: Artifact, prep: Prepared, job_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(files to store, meta.json): members are stored by their suffix after the job's name, which a hit renames."""
    files, members = {}, []
    for i, (member, path) in enumerate(art.members.items()):
        suffix = member[len(prep.name):] if member.startswith(prep.name) else f"/{member}"
        files[f"m{i}"] = path
        members.append([f"m{i}", suffix, member == art.model_member])
    meta = {"source_job_id": job_id, "created_at": jobid.iso(jobid.utc_now()), "target": prep.entry.target,
            "model": art.model_member, "members": members,
            "quantization": art.quantization, "platform": art.platform, "image": art.image, "image_id": art.image_id,
            "report": art.report}
    return files, meta


def _restore(meta: dict[str, Any], prep: Prepared) -> Artifact | None:
    """The artifact of a hit, its members named after this job's model (the files were put in work/cached/); None
    when meta.json's members are not plain names of its stored files (damaged or tampered: never a `../x` member)."""
    folder = prep.work_dir / "cached"
    members, model = {}, ""
    try:
        for stored, suffix, is_model in meta["members"]:
            member = suffix[1:] if suffix.startswith("/") else f"{prep.name}{suffix}"
            if stored not in meta["files"] or "/" in member or member in ("", ".", ".."):
                return None
            members[member] = folder / stored
            model = member if is_model else model
        return Artifact(model, members, meta["quantization"], meta["platform"], meta["image"], meta["image_id"],
                        meta["report"]) if model else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def compile(prep: Prepared, ctx: Context, job_id: str, skip: Callable[[list[str]], None]) -> Made:
    """The backend's compile, or the cached artifacts of an identical earlier one (`skip` gets the steps not run)."""
    entry = prep.entry
    tools = toolchain(entry.target, ctx)
    rows = [(sha256_file(s.image), str(s.image)) for s in prep.chosen]
    key = cachekey.compile_key(key_inputs(prep, tools, ctx.config, rows, decided(prep, ctx)))
    store = cache.for_config(ctx.config)
    backend = backends.get(entry.target)
    if not (entry.cache and store.enabled):
        ctx.log.line(f"cache: not used ({'cache: false in the manifest' if store.enabled else 'cache.max_bytes is 0'}), "
                     f"key {key}")
        return Made(_compiled(backend, prep, ctx), key, False, None, tools, rows)
    with store.locked(key, ctx.interrupted):  # not while compiling: a stuck attempt must not hold back its successor
        meta = store.get(key, prep.work_dir / "cached")
    cached = _restore(meta, prep) if meta is not None else None
    if meta is not None and cached is not None:
        skip(backend.steps(entry))
        ctx.log.line(f"cache: hit {key}, compiled by job {meta['source_job_id']}: compiler steps skipped")
        return Made(cached, key, True, meta["source_job_id"], tools, rows)
    ctx.log.line(f"cache: miss {key}")
    art = _compiled(backend, prep, ctx)
    files, meta = _meta(art, prep, job_id)
    if not ctx.current():  # a superseded attempt never stores what a later drop would publish as a hit
        raise SaigeError("ENGINE_LOST", "this attempt was requeued when its engine stopped answering", superseded=True)
    try:
        with store.locked(key, ctx.interrupted):
            note = "kept" if store.put(key, files, meta, prep.work_dir) else "not kept (larger than cache.max_bytes)"
    except OSError as exc:  # a full state_dir costs the next identical drop a compile, not this job its bundle
        note = f"not kept ({exc})"
    ctx.log.line(f"cache: {note} {key}")
    return Made(art, key, False, None, tools, rows)


def _compiled(backend: Any, prep: Prepared, ctx: Context) -> Artifact:
    """The compiler's artifact, each member a regular file it wrote in the attempt's folder: never a link a step
    planted there to a host file, which the cache and the bundle would then publish."""
    art: Artifact = backend.compile(prep, ctx)
    for name, path in art.members.items():
        why = written_inside(path, prep.work_dir)
        if why is not None:
            raise bundle.not_taken(f"{name} is {why}: it is neither bundled nor cached")
    return art

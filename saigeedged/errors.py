"""The one error type of saigeedged: stable codes (SPEC §10), hints and the retryable flag."""

from __future__ import annotations

from typing import Any, Literal, TypedDict, get_args

# The stable error codes (SPEC §10, §11): mypy --strict rejects a code spelt any other way.
Code = Literal[
    "MANIFEST_INVALID", "PATH_NOT_ALLOWED", "INPUT_NOT_FOUND", "INPUT_INCOMPLETE", "ONNX_INVALID", "SYMBOLIC_DIM",
    "INPUT_SIZE_MISMATCH", "SURGERY_OUTPUTS_NOT_FOUND", "CALIB_INVALID",
    "DOCKER_UNAVAILABLE", "IMAGE_NOT_FOUND", "CONTAINER_FAILED", "CONTAINER_LOST", "ENGINE_LOST", "CHILD_LOST",
    "STEP_FAILED", "QUANTIZE_NO_OUTPUT", "EXPORT_FAILED", "NBG_INVALID", "TIMEOUT", "PUBLISH_FAILED", "CANCELLED",
    "INTERNAL", "ACCURACY_GATE", "OUT_OF_MEMORY",
]
CODES: tuple[Code, ...] = get_args(Code)


class ErrorDoc(TypedDict):
    """The `error` object of a status file."""

    code: Code
    message: str
    hint: str
    step: str | None


GATE_REMEDIES = ("try another calibration_method, more varied calibration images, hybrid layers, qtype int16, or "
                 "lower the manifest's `accuracy:` gate")
HINTS: dict[Code, str] = {
    "MANIFEST_INVALID": "fix the named field in the manifest; `saigeedged validate MANIFEST` checks it without compiling",
    "PATH_NOT_ALLOWED": "put the file inside the inbox or add its folder to `allowed_roots` in the daemon config",
    "INPUT_NOT_FOUND": "check the path; relative paths are resolved against the manifest's folder, and a share "
    "must be mounted on the compile host itself",
    "INPUT_INCOMPLETE": "write the ONNX first and the manifest last, each under a temporary name then renamed "
    "(`saigeedged submit` does this); check the manifest's sha256",
    "ONNX_INVALID": "re-export the model (opset >= 11, one input) and check it with onnx.checker",
    "SYMBOLIC_DIM": "re-export with static shapes (no dynamic_axes), e.g. batch 1 and a fixed input size",
    "INPUT_SIZE_MISMATCH": "drop `input_size` from the manifest or re-export the ONNX at that size",
    "SURGERY_OUTPUTS_NOT_FOUND": "the YOLOX head Concat nodes are missing: airockchip-style exports remove them; "
    "export with the original YOLOX head or name the three head tensors in `surgery.output_names` "
    "(a classifier or re-id model needs task: mlc or reid, not detection)",
    "CALIB_INVALID": "fix the calibration file: every image must exist and decode, every label must be in [0, num_classes)",
    "DOCKER_UNAVAILABLE": "start dockerd and add the service user to the `docker` group; `saigeedged check` tells more",
    "IMAGE_NOT_FOUND": "docker load -i ubuntu-npu_v2.0.10.1.tar, then check the tag with `docker images`",
    "CONTAINER_FAILED": "a container with that name exists without the work-root mount: remove or rename it "
    "(`docker rm -f NAME`) so saigeedged can create its own; if the engine's default runtime is nvidia, set runtime: runc",
    "CONTAINER_LOST": "the compiler container died mid-job (dockerd restart, OOM?); it is recreated and the job retried",
    "ENGINE_LOST": "a compile host's Docker engine stopped answering mid-job: the job runs again on another engine; "
    "`saigeedged check` names the engine and what it lacks",
    "CHILD_LOST": "the host process that ran onnxruntime for the job was killed (OOM killer, `kill`): the job runs "
    "again; `journalctl -k` says whether the kernel killed it",
    "STEP_FAILED": "read the job log: the compiler's last lines are in the message",
    "QUANTIZE_NO_OUTPUT": "quantize exited 0 without a .quantize file: the quantizer/qtype pair does not match "
    "(asymmetric_affine/uint8, dynamic_fixed_point/int16, perchannel_symmetric_affine/int8, ...)",
    "EXPORT_FAILED": "the NBG generator failed; see the message for the fatal code",
    "NBG_INVALID": "the NBG targets another chip than the platform (on the board: vip_create_network status=-4); "
    "check `platform:` and `optimize:`",
    "TIMEOUT": "raise limits.step_timeout_s / limits.job_timeout_s, or check the job log for a hung step",
    "PUBLISH_FAILED": "the outbox is full or not writable (or a file is in the way): make room or fix its permissions; "
    "the daemon tries a built bundle again for limits.publish_patience_s",
    "CANCELLED": "the job was cancelled; `saigeedged retry JOB_ID` runs it again",
    "INTERNAL": "a bug in saigeedged: please report it with the job log",
    "ACCURACY_GATE": "the compiled model is too far from the float ONNX (the report is in the job log and the status "
    f"file; the bundle is kept under <inbox>/.saigeedged/failed/<job_id>/): {GATE_REMEDIES}",
    "OUT_OF_MEMORY": "the work needed more memory than a bound allows; the message names it (RLIMIT_AS from "
    "prlimit/LimitAS=, limits.child_memory_bytes, or the unit's MemoryMax=): raise that bound, or give the job a "
    "smaller input (the accuracy report: fewer `eval_samples`)",
}

# The hint of a retryable code's error that ends its job for good (raised with `exhausted=True`: waiting will not
# help any more, decision.decide ends the job): its HINTS line says the job is retried, which is no longer true.
EXHAUSTED_HINTS: dict[Code, str] = {
    "CONTAINER_LOST": "the compiler container died under every attempt (limits.max_attempts): check `journalctl -u "
    "docker` and `journalctl -k` (OOM?), then `saigeedged retry JOB_ID`",
    "ENGINE_LOST": "the Docker engine stopped answering under every attempt (limits.max_attempts): `saigeedged check` "
    "names the engine; `saigeedged retry JOB_ID` once it answers",
    "CHILD_LOST": "the host process that ran onnxruntime for the job was killed under every attempt "
    "(limits.max_attempts): `journalctl -k` says whether the kernel killed it; `saigeedged retry JOB_ID`",
    "PUBLISH_FAILED": "the job failed for good, its bundle unpublished: make room on the outbox or fix its permissions, "
    "then `saigeedged retry JOB_ID` once it takes files (the inputs are kept under <inbox>/.saigeedged/failed/<job_id>/)",
}

FATAL_HINTS: dict[int, str] = {
    65280: "a tensor dtype the target cannot take (e.g. hybrid tensors promoted next to the outputs) "
    "or a simulator without a real /proc: lower hybrid_topn or use another hybrid_dtype",
    64768: "graph verification failed: check the ONNX for layers the NPU does not support",
    32512: "simulator libraries not found: check cubie.viv_sdk and the image",
}

RETRYABLE: frozenset[Code] = frozenset({"CONTAINER_LOST", "ENGINE_LOST", "CHILD_LOST", "PUBLISH_FAILED"})
MAX_MESSAGE = 4000  # characters: a message quoting a hostile input must not copy it into every status file and log


class SaigeError(Exception):
    """A failure with a stable `code`, a message naming the field or file, and a one-line hint."""

    def __init__(self, code: Code, message: str, *, hint: str | None = None, **fields: Any) -> None:
        if code not in CODES:  # a code read back from a file or a child process is checked here too
            raise ValueError(f"unknown error code {code}")
        # a file name that is not UTF-8 arrives as lone surrogates, which no log, journal or JSON reader takes
        message = message.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        if len(message) > MAX_MESSAGE:
            message = f"{message[:MAX_MESSAGE]}... ({len(message) - MAX_MESSAGE} more characters)"
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint or (EXHAUSTED_HINTS.get(code) if fields.get("exhausted") else None) or HINTS[code]
        self.fields = fields

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by code, message, hint and fields: errors come back from child processes as themselves."""
        return _rebuild, (self.code, self.message, self.hint, self.fields)

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE

    @property
    def stop(self) -> bool:
        """The daemon's stop interrupted the work (raised as CANCELLED with reason `stop`): no failure and no cancel,
        the job goes on at the next start."""
        return self.code == "CANCELLED" and self.fields.get("reason") == "stop"

    def as_dict(self, step: str | None = None) -> ErrorDoc:
        """The `error` object of a status file (never a traceback)."""
        return {"code": self.code, "message": self.message, "hint": self.hint, "step": step}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def _rebuild(code: Code, message: str, hint: str, fields: dict[str, Any]) -> SaigeError:
    return SaigeError(code, message, hint=hint, **fields)


# Bad input (exit 2): found before any compiler runs.
INPUT_CODES: frozenset[Code] = frozenset({
    "MANIFEST_INVALID", "PATH_NOT_ALLOWED", "INPUT_NOT_FOUND", "INPUT_INCOMPLETE", "ONNX_INVALID", "SYMBOLIC_DIM",
    "INPUT_SIZE_MISMATCH", "SURGERY_OUTPUTS_NOT_FOUND", "CALIB_INVALID"})
# The host is not ready (exit 3).
ENVIRONMENT_CODES: frozenset[Code] = frozenset({"DOCKER_UNAVAILABLE", "IMAGE_NOT_FOUND", "CONTAINER_FAILED"})


def out_of_attempts(exc: SaigeError) -> SaigeError:
    """A retryable error that ended its job because limits.max_attempts ran out: the same error with the hint of one
    that ends the job for good (its HINTS line says the job runs again)."""
    if not exc.retryable or exc.hint != HINTS[exc.code]:
        return exc
    return SaigeError(exc.code, exc.message, **{**exc.fields, "exhausted": True})

"""Where to put the accuracy gate (SPEC §17), measured (not a test): the report the product makes for the test
suite's detectors and classifiers (seeded weights) and for broken detectors (pixel-scale boxes beside the scores,
`box_gain`), per calibration setup the tests use; the worst and the mean over held-out images of every output's
cosine and of the decoded-score correlation.

The compiled model is the product's own emulation (report.emulated_job: onnxruntime QDQ uint8, the manifest's
calibration method), which is also exactly what the host target's INT8 model is (same quantize call, same
inputs); `--check-host` compares the two on one model.

    .venv/bin/python bench/gate.py [--seeds 0-40] [--setups A,B] [--gains 1,30,100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

import yaml

sys.path[:0] = [str(Path(__file__).parent.parent), str(Path(__file__).parent.parent / "tests")]  # this checkout's package
from factory import classifier, random_labels, valjson, yolox  # noqa: E402

from saigeedged import config as configmod  # noqa: E402
from saigeedged import manifest  # noqa: E402
from saigeedged.compile import accuracy, evaluate, images, prepare, report  # noqa: E402
from saigeedged.compile.inputs import PathPolicy  # noqa: E402

# the names whose crc32 seeds a test's model (tests/test_daemon_docker.py named_model, test_real_systemd, ...)
NAMES = ("failimport", "fatal65280", "slowjob", "hang", "slowkill", "slowlost", "slow", "hangkill", "slowterm",
         "hostdet", "cubiedet", "afterhup", "slowstop", "slowfreeze", "good", "mixed")
# setup: (val.json images, n_samples, eval_samples, the tests that use it)
SETUPS = {"A": (8, 4, 16, "det_inputs: most daemon tests (4 held out)"),
          "B": (40, 8, 16, "test_mixed_head_trips_the_gate (16 held out)"),
          "C": (30, 8, 12, "test_host_report_is_what_onnxruntime_gives"),
          "D": (20, 8, 4, "test_cubie_report_comes_from_the_simulator"),
          "E": (24, 8, 16, "variant sweep; the demo (24, n_samples 16)")}


def _entry(root: Path, src: Path, calib: Path, task: str, n: int, eval_n: int, target: str, **extra: Any) -> Any:
    mf = root / f"{src.stem}.yml"
    classes = 3 if task == "detection" else 4
    mf.write_text(yaml.safe_dump({"task": task, "num_classes": classes, "calib": str(calib), "onnx": str(src),
                                  "n_samples": n, "eval_samples": eval_n, "target": target, **extra}))
    return manifest.load(mf, configmod.from_dict({}, root).defaults.as_dict())[0]


def measure(root: Path, src: Path, calib: Path, task: str, n: int, eval_n: int, target: str = "cubie",
            **extra: Any) -> dict[str, Any]:
    """The product's report for one model (in-process: the child jobs called directly), and per-image cosines."""
    entry = _entry(root, src, calib, task, n, eval_n, target, **extra)
    work = root / f"work-{src.stem}-{target}-{extra.get('calibration_method', '')}{extra.get('qtype', '')}"
    prep = prepare.inspect_job(entry, work, PathPolicy(), "0" * 64)
    if task == "detection":
        prep = prepare.surgery_job(prep)
    prep.chosen, prep.dataset = prepare.calibrate_job(prep)
    wrapped, emulated = work / "eval-float.onnx", work / "emulated.onnx"
    rep = report.emulated_job(prep, emulated, wrapped)
    compiled = wrapped if entry.qtype in report.FLOAT_QTYPES else emulated
    ref_s, got_s = evaluate.session(wrapped), evaluate.session(compiled)
    names = [o.name for o in ref_s.get_outputs()]
    per: dict[str, list[float]] = {nm: [] for nm in names}
    scores: list[float] = []
    for s in prep.held_out:
        x = {prep.info.input_name: images.load_rgb(s.image, prep.input_size, entry.profile.letterbox)[None]}
        ref, got = ref_s.run(names, x), got_s.run(names, x)
        for nm, r, g in zip(names, ref, got, strict=True):
            per[nm].append(accuracy.cosine(r, g))
        if task == "detection":
            scores.append(accuracy.cosine(*evaluate._centred(accuracy.yolox_scores(ref), accuracy.yolox_scores(got))))
    for nm in names:  # the per-image numbers are the report's
        assert abs(min(per[nm]) - rep["outputs"][nm]["cosine"]) < 1e-5, (nm, min(per[nm]), rep["outputs"][nm])
    return {"report": rep, "per_output": per, "scores": scores}


def _summary(m: dict[str, Any]) -> dict[str, Any]:
    per, scores = m["per_output"], m["scores"]
    worst_out = min(min(v) for v in per.values())
    mean_out = min(statistics.fmean(v) for v in per.values())
    task = m["report"]["task"] or {}
    return {"images": m["report"]["images"], "out_worst": worst_out, "out_mean": mean_out,
            "score_worst": min(scores) if scores else None, "score_mean": statistics.fmean(scores) if scores else None,
            "drop": task.get("drop"), "map_vs_float": task.get("map50_vs_float")}


def _seed_list(spec: str) -> list[tuple[str, int]]:
    lo, hi = (int(x) for x in spec.split("-"))
    return [(n, zlib.crc32(n.encode())) for n in NAMES] + [(str(s), s) for s in range(lo, hi + 1)]


def _fmt(v: float | None) -> str:
    return "    -   " if v is None else f"{v:8.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0-40")
    parser.add_argument("--setups", default="A,B,D")
    parser.add_argument("--gains", default="1,30,100")
    parser.add_argument("--mlc", action="store_true", help="classifiers too (seeds 0-4, sizes 64 and 224)")
    parser.add_argument("--variants", action="store_true", help="setup E with kl and int16 too")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for key in args.setups.split(","):
            total, n, eval_n, _ = SETUPS[key]
            calib = valjson(root / f"data{key}", random_labels(total, 3))
            for gain in (float(g) for g in args.gains.split(",") if g):
                for label, seed in _seed_list(args.seeds):
                    src = yolox(root / f"d{key}_{label}_{int(gain)}.onnx", size=(64, 64), seed=seed, box_gain=gain)
                    extras: list[dict[str, Any]] = [{}]
                    if args.variants:
                        extras += [{"calibration_method": "minmax"}, {"calibration_method": "kl"},
                                   {"qtype": "int16", "calibration_method": "minmax"}]
                    for extra in extras:
                        s = _summary(measure(root, src, calib, "detection", n, eval_n, **extra))
                        rows.append({"setup": key, "task": "detection", "gain": gain, "model": label, **extra, **s})
                        print(f"{key} gain {gain:5.0f} {label:>11} {json.dumps(extra):<40} imgs {s['images']:2d} "
                              f"out worst {_fmt(s['out_worst'])} mean {_fmt(s['out_mean'])}  "
                              f"scores worst {_fmt(s['score_worst'])} mean {_fmt(s['score_mean'])}", flush=True)
            if args.mlc:
                mcalib = valjson(root / f"mdata{key}", random_labels(total, 4))
                for seed in range(5):
                    for size in (64, 224):
                        src = classifier(root / f"c{key}_{seed}_{size}.onnx", 4, (size, size), seed=seed)
                        s = _summary(measure(root, src, mcalib, "mlc", n, eval_n, target="mobilint", device="regulus-rb",
                                             input_size=[size, size]))
                        rows.append({"setup": key, "task": "mlc", "gain": 1.0, "model": f"cls{seed}@{size}", **s})
                        print(f"{key} mlc {f'cls{seed}@{size}':>11} imgs {s['images']:2d} out worst {_fmt(s['out_worst'])} "
                              f"mean {_fmt(s['out_mean'])} mAP drop {_fmt(s['drop'])}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    _table(rows)


def _table(rows: list[dict[str, Any]]) -> None:
    """Per setup and model kind: the range of each statistic."""
    print("\nsetup task       gain  n  | out worst min/max  out mean min/max | score worst min/max | score mean min/max"
          " | mAP drop min/max")
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["setup"], r["task"], r["gain"], r.get("calibration_method", ""), r.get("qtype", "")),
                          []).append(r)
    for (key, task, gain, method, qtype), rs in sorted(groups.items()):
        def rng(k: str, rs: list[dict[str, Any]] = rs) -> str:
            vals = [r[k] for r in rs if r[k] is not None]
            return f"{min(vals):.4f}/{max(vals):.4f}" if vals else "   -   "
        print(f"{key:5} {task:9} {gain:5.0f} {len(rs):2d}  | {rng('out_worst'):>17}  {rng('out_mean'):>16} | "
              f"{rng('score_worst'):>19} | {rng('score_mean'):>18} | {rng('drop'):>15}  {method}{qtype}")


if __name__ == "__main__":
    main()

"""The accuracy report (SPEC §17) as text: the job log, `saigeedged status JOB` and the demo print the same lines; and
its figures that are no number made null, as JSON needs (no numpy: the daemon imports it)."""

from __future__ import annotations

import math
from typing import Any


def worst_cosine(result: dict[str, Any]) -> float | None:
    """The lowest cosine of the report: every output's worst image and, for detection, the decoded scores' (the gate
    reads the means over the images, see compile/report.judge)."""
    values = [row["cosine"] for row in result.get("outputs", {}).values()]
    score = (result.get("task") or {}).get("score_cosine")
    values += [score] if score is not None else []
    if None in values:  # not a finite number (nulled): no worst to show
        return None
    return min(float(v) for v in values) if values else None


def table(result: dict[str, Any]) -> list[str]:
    """The report as the job log and `saigeedged status JOB` print it."""
    lines = [f"accuracy ({result['method']}, {result['images']} held-out images)"]
    lines += [f"  output {name:<28} {_cosine(row, 'cosine', 'cosine_mean')}  "
              f"max abs {figure(row['max_abs_error'], '.4g')}" for name, row in result["outputs"].items()]
    task = result.get("task") or {}
    if task.get("score_cosine") is not None:
        lines.append(f"  decoded scores                      {_cosine(task, 'score_cosine', 'score_cosine_mean')}")
    if task.get("map50_vs_float") is not None:
        lines.append(f"  {task['metric']} against the float model's detections {figure(task['map50_vs_float'])}")
    if task.get("drop") is not None:
        lines.append(f"  {task['metric']} float {figure(task['float'])}  compiled {figure(task['compiled'])}  "
                     f"drop {figure(task['drop'])}")
    elif task.get("labels"):
        lines.append(f"  {task['labels']}")
    if result.get("worst_layers") and result.get("layer_images"):
        lines.append(f"  worst layers over the first {result['layer_images']} held-out images:")
    lines += [f"  layer {row['tensor']:<29} cosine mean {figure(row['cosine_mean'])}  "
              f"max abs {figure(row['max_abs_error'], '.4g')}" for row in result.get("worst_layers", [])[:3]]
    if result.get("default_quantization"):
        lines.append(f"  left at default quantization (scale 1, zero point 0): {', '.join(result['default_quantization'])}")
    if result.get("gate"):
        verdict = "passed" if result["gate"]["passed"] else "FAILED: " + "; ".join(result["gate"]["failures"])
        lines.append(f"  gate min_cosine {result['gate']['min_cosine']} (mean over the images) max_map_drop "
                     f"{result['gate']['max_map_drop']}: {verdict}")
    lines += [f"  note: {note}" for note in result.get("notes", [])]
    if result.get("cost"):
        lines.append(f"  made in {result['cost']['seconds']:.1f} s, peak RSS {result['cost']['peak_rss_bytes'] >> 20} MiB")
    return lines + variant_lines(result)


def _cosine(row: dict[str, Any], worst: str, mean: str) -> str:
    """The mean over the held-out images (what the gate reads), then the worst image's (a report of before the mean
    has none)."""
    return f"cosine {figure(row[worst])}" if mean not in row else f"cosine mean {figure(row[mean])} worst {figure(row[worst])}"


def figure(value: float | None, spec: str = ".4f") -> str:
    """A figure of the report; None: one that was not a finite number (nulled)."""
    return "NaN/inf" if value is None else format(value, spec)


def variant_lines(result: dict[str, Any]) -> list[str]:
    """The sweep's table (SPEC §17): every variant, the chosen one marked."""
    rows = result.get("variants") or []
    if not rows:
        return []
    lines = [f"  variants ({len(rows)}; published: the best that passes the gate)"]
    for row in rows:
        mark = "*" if row["variant"] == result.get("chosen") else " "
        cos = "-" if row["worst_cosine"] is None else f"{row['worst_cosine']:.4f}"
        drop = "-" if row["map_drop"] is None else f"{row['map_drop']:.4f}"
        verdict = "passed" if row["passed"] else "below the gate"
        same = f"  (the same compile as {row['same_as']})" if row.get("same_as") else ""
        lines.append(f"  {mark} {row['variant']}. {row['name']:<36} cosine {cos}  mAP drop {drop}  {verdict}"
                     f"{'  (cache hit)' if row['cache_hit'] else ''}{same}")
    return lines


def nulled(value: Any, at: str = "") -> list[str]:
    """Every float of a report (a dict of dicts and lists) that is NaN or inf replaced by None, in place (JSON has no
    NaN: the store's doc, the status file and the bundle would not parse); their paths (`outputs.emb.cosine`)."""
    found: list[str] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        path = f"{at}.{key}" if at else str(key)
        if isinstance(item, float) and not math.isfinite(item):
            value[key] = None
            found.append(path)
        else:
            found += nulled(item, path)
    return found

"""Accuracy metrics (SPEC §17), pure numpy: cosine, max abs error, YOLOX decode + NMS, mAP@0.5, multi-label mAP."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

STRIDES = (8, 16, 32)
IOU_NMS = 0.45
IOU_MATCH = 0.5
CONF = 0.01  # low on purpose: mAP integrates over every score, the postprocess threshold is the application's
MAX_DETECTIONS = 100
NMS_CHUNK = 128  # candidates compared with the kept boxes at once (nms)
MAX_LOG_WH = 10.0  # exp() of a wild regression stays finite

Floats = NDArray[np.float64]


def cosine(a: NDArray[np.floating], b: NDArray[np.floating]) -> float:
    """Cosine similarity of two flattened tensors; two zero tensors are identical."""
    return compared(a, b)[0]


def compared(a: NDArray[np.floating], b: NDArray[np.floating]) -> tuple[float, float]:
    """(cosine, max abs error) of two tensors. The sums accumulate in float64 over buffered chunks (einsum's dtype):
    no float64 copy of a tensor is made (the per-layer table's cost was those copies). The difference is taken in the
    tensors' own dtype: exact where the two values are within a factor 2, else rounded once."""
    x, y = np.ravel(a), np.ravel(b)
    dot, nx, ny = (float(np.einsum("i,i", u, v, dtype=np.float64)) for u, v in ((x, y), (x, x), (y, y)))
    err = float(np.max(np.abs(x - y), initial=0.0))
    if nx == 0 or ny == 0:
        return (1.0 if nx == ny else 0.0), err
    return float(np.clip(dot / np.sqrt(nx * ny), -1.0, 1.0)), err


@dataclass(frozen=True)
class Detections:
    """One image's detections: boxes xyxy in input pixels, scores, class ids."""

    boxes: Floats
    scores: Floats
    classes: NDArray[np.int64]


def yolox_scores(heads: Sequence[NDArray[np.floating]]) -> Floats:
    """obj * cls of every cell of the three head maps [1, 5+C, h, w], as [cells, C]."""
    rows = [np.asarray(h, np.float64)[0].reshape(h.shape[1], -1).T for h in heads]
    cells = np.concatenate(rows)
    scores: Floats = cells[:, 4:5] * cells[:, 5:]
    return scores


def decode_yolox(heads: Sequence[NDArray[np.floating]], conf: float = CONF, iou: float = IOU_NMS) -> Detections:
    """The YOLOX head (strides 8/16/32: xy = (reg + grid) * stride, wh = exp(reg) * stride), obj*cls scores, NMS."""
    boxes, scores = [], []
    for head, stride in zip(heads, STRIDES, strict=True):
        h = np.asarray(head, np.float64)[0]
        height, width = h.shape[1:]
        gy, gx = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
        cx, cy = (h[0] + gx) * stride, (h[1] + gy) * stride
        w, hh = (np.exp(np.clip(h[i], -MAX_LOG_WH, MAX_LOG_WH)) * stride for i in (2, 3))
        boxes.append(np.stack([cx - w / 2, cy - hh / 2, cx + w / 2, cy + hh / 2], -1).reshape(-1, 4))
        scores.append((h[4:5] * h[5:]).reshape(h.shape[0] - 5, -1).T)
    box, score = np.concatenate(boxes), np.concatenate(scores)
    cls = score.argmax(1)
    best = score[np.arange(len(cls)), cls]
    keep = best >= conf
    return nms(box[keep], best[keep], cls[keep], iou)


def iou_matrix(a: Floats, b: Floats) -> Floats:
    """Pairwise IoU of xyxy boxes [n, 4] x [m, 4]."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    union = _area(a)[:, None] + _area(b)[None, :] - inter
    out: Floats = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    return out


def _area(boxes: Floats) -> Floats:
    area: Floats = np.prod(np.clip(boxes[:, 2:] - boxes[:, :2], 0, None), axis=1)
    return area


def nms(boxes: Floats, scores: Floats, classes: NDArray[np.int64], iou: float = IOU_NMS) -> Detections:
    """Per-class greedy non-maximum suppression, best first, at most MAX_DETECTIONS kept.

    Greedy as ever (a box is kept when no kept box before it overlaps it more than `iou` in its class), but the
    candidates are taken NMS_CHUNK at a time in score order: the boxes kept so far are compared with a chunk at once,
    and the chunk's boxes with each other in one matrix (NMS_CHUNK^2 pairs), so the greedy pass over the chunk only
    reads rows of booleans. A 640 detector has 8400 cells that may all pass CONF: comparing each kept box with every
    box after it cost 10 ms an image, a comparison per kept box 4 ms, this 1.4. Never the n x n matrix (70 M pairs).
    """
    order = np.argsort(-scores, kind="stable")
    x1, y1, x2, y2 = boxes[order].T
    area = _area(boxes[order])
    ranked = classes[order]
    kept: list[int] = []  # rank positions
    for start in range(0, len(order), NMS_CHUNK):
        chunk = np.arange(start, min(start + NMS_CHUNK, len(order)))
        alive = np.ones(len(chunk), bool)
        if kept:
            k = np.asarray(kept)[:, None]
            alive &= ~((_overlap(x1, y1, x2, y2, area, k, chunk[None, :]) > iou) & (ranked[k] == ranked[chunk])).any(0)
        suppresses = (_overlap(x1, y1, x2, y2, area, chunk[:, None], chunk[None, :]) > iou) \
            & (ranked[chunk][:, None] == ranked[chunk][None, :])
        for j in np.flatnonzero(alive).tolist():
            if not alive[j]:  # suppressed by a box of this chunk kept before it
                continue
            kept.append(start + j)
            if len(kept) == MAX_DETECTIONS:
                break
            alive[j + 1:] &= ~suppresses[j, j + 1:]
        if len(kept) == MAX_DETECTIONS:
            break
    idx = order[np.asarray(kept, np.int64)]
    return Detections(boxes[idx].reshape(-1, 4), scores[idx], classes[idx])


def _overlap(x1: Floats, y1: Floats, x2: Floats, y2: Floats, area: Floats, a: Any, b: Any) -> Floats:
    """IoU of boxes `a` with boxes `b` (rank positions, broadcast): iou_matrix's float operations in its order."""
    inter = np.clip(np.minimum(x2[a], x2[b]) - np.maximum(x1[a], x1[b]), 0, None) \
        * np.clip(np.minimum(y2[a], y2[b]) - np.maximum(y1[a], y1[b]), 0, None)
    union = area[a] + area[b] - inter
    out: Floats = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    return out


def _average_precision(hits: list[tuple[float, bool]], n_truth: int) -> float:
    """VOC-style all-point interpolated AP from (score, true positive) pairs, over score thresholds: hits with the same
    score enter the precision/recall curve together, so the order they were listed in (the images') changes nothing
    (INT8 scores tie often)."""
    if n_truth == 0 or not hits:
        return 0.0
    scores = np.asarray([h[0] for h in hits], np.float64)
    good = np.asarray([h[1] for h in hits], bool)
    order = np.argsort(-scores, kind="stable")
    scores, good = scores[order], good[order]
    last = np.append(scores[1:] != scores[:-1], True)  # the last hit of each group of equal scores: one threshold
    tp = np.cumsum(good, dtype=np.float64)[last]
    fp = np.cumsum(~good, dtype=np.float64)[last]
    recall = np.concatenate([[0.0], tp / n_truth, [1.0]])
    precision = np.concatenate([[1.0], tp / np.maximum(tp + fp, 1e-12), [0.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.nonzero(np.diff(recall))[0]
    return float(np.sum((recall[steps + 1] - recall[steps]) * precision[steps + 1]))


def map50(found: Sequence[Detections], truth: Sequence[tuple[Floats, NDArray[np.int64]]],
          num_classes: int) -> float | None:
    """mAP@0.5 over the classes that have ground truth (None: no box at all); per image, detections best first take
    the unmatched box of their class they overlap most."""
    hits: dict[int, list[tuple[float, bool]]] = {c: [] for c in range(num_classes)}
    totals = dict.fromkeys(range(num_classes), 0)
    for det, (gt_boxes, gt_classes) in zip(found, truth, strict=True):
        for c in gt_classes.tolist():
            totals[c] += 1
        overlaps = iou_matrix(det.boxes, gt_boxes) if len(gt_boxes) else np.zeros((len(det.scores), 0))
        taken = np.zeros(len(gt_boxes), bool)
        for i in np.argsort(-det.scores, kind="stable"):
            cls = int(det.classes[i])
            candidates = np.where((gt_classes == cls) & ~taken, overlaps[i], -1.0)
            j = int(np.argmax(candidates)) if len(candidates) else -1
            ok = j >= 0 and candidates[j] >= IOU_MATCH
            if ok:
                taken[j] = True
            hits[cls].append((float(det.scores[i]), ok))
    present = [c for c in range(num_classes) if totals[c]]
    return float(np.mean([_average_precision(hits[c], totals[c]) for c in present])) if present else None


def multilabel_map(scores: Floats, labels: NDArray[np.bool_]) -> float | None:
    """Mean over classes with a positive image of the average precision of ranking the images by score."""
    aps = []
    for c in range(labels.shape[1]):
        if labels[:, c].any():
            aps.append(_average_precision([(float(s), bool(y)) for s, y in zip(scores[:, c], labels[:, c], strict=True)],
                                          int(labels[:, c].sum())))
    return float(np.mean(aps)) if aps else None

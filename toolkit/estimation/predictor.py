"""Kernel predictors: per kernel class and device, a gradient-boosted regression of a kernel's time on the
estimator's own features of it (FLOPs, bytes, roofline time, launches, nodes, and what its class's shape says:
a conv's channels, positions, area, groups, width and the layout the runtime runs it in, a MatMul's m, k, n, a
cell's sizes, a movement kernel's runs, what an elementwise, movement, quantize or recurrent kernel computes:
`SHAPE_FEATURES`), trained on a sweep of that device (`sweep.py`), with the roofline as a feature and as a floor.

Trained with scikit-learn and kept as data: each tree's split features, thresholds, children and leaf values in
JSON (schema `tapeout.predictor/1`), walked here; nothing is unpickled. A predictor is for one device (its name
carries the host's CPU and thread count) and one target, and is never read for another. Its band per class is the
range (10th–90th percentile) of its errors on sweep points held out of its training (5 folds).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tapeout.core.errors import BadInput
from tapeout.core.files import write_text
from tapeout.estimation import runtime_kernels, softmax_masks

SCHEMA = "tapeout.predictor/1"
FEATURES = ("log_flops", "log_bytes", "log_roof", "log_launches", "nodes")
# per class, the kernel's shape beside them (log of each; cost_units.Kernel.shape): FLOPs and bytes do not tell a
# 7×7 depthwise conv from a 1×1 dense one, and NCHWc kernels differ in speed by both. `layout`: whether ONNX
# Runtime runs the conv blocked (NCHWc) or plain (im2col and a GEMM), asked of the runtime (`runtime_kernels`), not
# kept in the cost units: at the same FLOPs the blocked kernel ran at ~270-290 GFLOP/s, the plain one at ~120-150.
# `rank`: 1 for a Conv1d (a speech model's front end: 64 taps on one channel is no 2-D conv's shape), 2 otherwise
# `pool_layout` (reduce): whether ONNX Runtime runs a MaxPool or AveragePool blocked (NCHWc), as after a blocked conv,
# or plain (every other reduce kernel: 1). Asked of the runtime by the pool's channels, which the cost units keep.
# `masked` (reduce): 1 + the percent of a Softmax's input a mask holds (softmax_masks.py; 1 for every other kernel).
# `m`, `k`, `n` (matmul): the GEMM's rows, depth and columns (held out, the FP32 MatMul points within ±15 % rose from
# 68 to 92 % knowing them, the dynamic INT8 ones from 39 to 82, the static QGemms from 28 to 74); (attention) its
# weighted sum's: heads × queries, keys, a head's width (openvino_graph._scores_merged).
# `k_align`, `n_align` (matmul): the largest power of two, up to 64, dividing its depth and its columns (`alignment`):
# where a runtime runs a GEMM on AMX tiles (32 deep in bf16, 64 in INT8) it pads a depth off the tile, which a log of k
# cannot tell. One thread of an Intel Xeon with AMX, OpenVINO 2026.4: an NNCF INT8 128 × 768 × 768 in 137 µs, 129 ×
# 767 × 770 in 204; in bf16 (its CPU plugin's default there) 128 × 256 × 256 in 12 µs, 128 × 255 × 256 in 23; in f32
# (as tapeout's openvino-cpu pins it: MLAS) 97 against 102, no step. Learned per device, so a CPU without AMX learns none.
# `width` (conv): its output rows' length (a spectrogram's 8 × 128 is not a 32 × 32 of its positions).
# `run` (movement): the elements each contiguous copy moves (kernel_shape.movement_run).
# `input`, `hidden` (recurrent): the cell's input width and hidden size (kernel_shape.recurrent_shape).
# `function` (elementwise, movement, quantize, recurrent): what the kernel computes (kernel_shape.function_shape): a Tanh
# is not a Relu of the same bytes, a DequantizeLinear a QuantizeLinear, nor a GRU an LSTM
SHAPE_FEATURES = {"conv": ("per_group", "out_channels", "positions", "area", "groups", "layout", "fill", "rank",
                           "width"),
                  "matmul": ("m", "k", "n", "k_align", "n_align"), "attention": ("m", "k", "n"),
                  "reduce": ("pool_layout", "masked"), "elementwise": ("function",),
                  "movement": ("function", "run"),
                  "quantize": ("function",), "recurrent": ("function", "input", "hidden")}


def alignment(size: int | None, most: int = 64) -> int | None:
    """The largest power of two, at most `most`, that divides `size` (None without a size)."""
    if not size or size < 1:
        return None
    return min(int(size) & -int(size), most)


# shape features filled in where missing: what the runtime decides, a 2-D conv's rank (the cost units write it for a
# 1-D conv only) and a MatMul's alignments (of its k and n, which it keeps). `fill`: the share of the output channels
# a blocked conv computes that are its own (18 of a padded 32 ran at ~130 GFLOP/s, 32 of 32 at ~270)
DERIVED = {"layout": runtime_kernels.conv_layout, "fill": runtime_kernels.conv_fill,
           "rank": lambda shape: 2 if "per_group" in shape else None, "pool_layout": runtime_kernels.pool_layout,
           "masked": lambda shape: softmax_masks.UNMASKED,
           "k_align": lambda shape: alignment(shape.get("k")), "n_align": lambda shape: alignment(shape.get("n"))}
# per target, the rules' method each INT8 class is swept quantized by (`sweep.quantization_of`), as an INT8 build for
# it quantizes such a kernel. ONNX Runtime (cpu-int8): a transformer's MatMuls and an LSTM dynamically (one
# DynamicQuantizeMatMul or DynamicQuantizeLSTM, its activation quantization inside), a CNN's convs statically (QDQ:
# a QLinearConv, the Q and DQ its graph keeps priced apart). OpenVINO (openvino-cpu-int8): convs and MatMuls by NNCF
# (FakeQuantize on the input, which the point keeps: OpenVINO fuses a model's into the op before). A kernel of a plan
# by another method is not the swept one
QUANTIZED_BY = {"onnxruntime": {"matmul": "dynamic", "conv": "static", "recurrent": "dynamic"},
                "openvino": {"matmul": "nncf", "conv": "nncf"}}
MIN_POINTS = 12          # a class with fewer measured points gets no predictor
FLOOR_S = 5e-8           # what a kernel's time is clamped to before the log (a difference of two p50s can be ≤ 0)


def class_key(cls: str, precision: str = "fp32", method: str | None = None, target: str = "onnxruntime") -> str:
    """A predictor's name for a kernel class at a precision: the class for FP32 (as every file has named them),
    `class@precision` for another (`matmul@int8`): an INT8 kernel is not an FP32 one of a quarter of the bytes; and
    `class@precision~method` for one quantized by another method than the one `QUANTIZED_BY` names for the class on
    its target (ONNX Runtime's static QGemm, `matmul@int8~static`, is not its DynamicQuantizeMatMul)."""
    if precision == "fp32":
        return cls
    usual = QUANTIZED_BY.get(target, {}).get(cls)
    return f"{cls}@{precision}" + (f"~{method}" if method and method != usual else "")


def base_class(key: str) -> str:
    return key.split("@", 1)[0]


def _method(key: str, target: str) -> tuple[str, str | None]:
    """(The key without its method, the method its kernels were quantized by) of a class key (`class_key`)."""
    plain, _, method = key.partition("~")
    return plain, (method or QUANTIZED_BY.get(target, {}).get(base_class(key))) if plain != base_class(key) else None


def features(flops: float, bytes_: float, roof_s: float, launches: int, nodes: int, cls: str = "",
             shape: dict | None = None, names: tuple[str, ...] | None = None) -> list[float] | None:
    """The feature vector of a kernel of class `cls` (its shape features `names`, by default the class's now; a
    predictor file names its own); None where the class reads a shape the kernel lacks (a build made before shapes
    were kept)."""
    base = [math.log(flops + 1), math.log(bytes_ + 1), math.log(max(roof_s, 1e-12)), math.log(max(launches, 1)),
            float(nodes)]
    names = SHAPE_FEATURES.get(base_class(cls), ()) if names is None else names
    shape = with_derived(shape, names)
    if names and not all((shape or {}).get(n, 0) > 0 for n in names):
        return None
    return base + [math.log(shape[n]) for n in names]


def with_derived(shape: dict | None, names: tuple[str, ...]) -> dict | None:
    """`shape` with the features in `names` that the runtime decides (`DERIVED`) filled in, where it has the rest."""
    missing = [n for n in names if n in DERIVED and n not in (shape or {})]
    if not missing:
        return shape
    filled = dict(shape or {})  # a kernel with no shape kept: a LayerNormalization's `pool_layout` is still 1
    for n in missing:
        value = DERIVED[n](filled)
        if value is not None:
            filled[n] = value
    return filled


class Tree(BaseModel):
    model_config = ConfigDict(extra="forbid")

    feature: list[int]
    threshold: list[float]
    left: list[int]
    right: list[int]
    value: list[float]


class ClassModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    init: float
    rate: float = Field(gt=0)
    trees: list[Tree] = Field(min_length=1)
    band: tuple[float, float]              # held-out relative error, 10th and 90th percentile
    points: int = Field(ge=1)
    held_out_within_15: float = Field(ge=0, le=1)  # share of held-out points predicted within ±15 %
    features: list[str] = Field(default_factory=lambda: list(FEATURES))  # what each tree's feature index names
    # what the trees' sum is the log of: None, a kernel's seconds (a file trained before); a number d, its seconds
    # over its roofline seconds plus d (the sweep's dispatch). That ratio is near flat from 10 µs to 10 ms where the
    # seconds span three decades, which depth-4 trees fit in steps: held out, 65 % of the 1-thread sweep's FP32
    # convs came within ±15 % of their time, against 53 % learning the seconds (reduce 50 against 44)
    relative_to_roof_plus_s: float | None = Field(None, ge=0)


class HostSpeed(BaseModel):
    """The host's own probe over the sweep (host_drift.summary): what its points' speed was."""

    model_config = ConfigDict(extra="forbid")

    fp32_gflops: float = Field(gt=0)
    fp32_gflops_range: tuple[float, float]
    bandwidth_gbs: float | None = Field(None, gt=0)
    probes: int = Field(ge=1)


class PredictorFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(alias="schema")
    device: str
    target: str
    host: str
    threads: int = Field(ge=0)
    created: str
    baseline_s: float = Field(ge=0)        # a run's cost without any node (Identity's, less one node's dispatch)
    input_s: float = Field(0.0, ge=0)      # what each input of a model beyond the first adds (0: not timed apart)
    dispatch_s: float = Field(0.0, ge=0)   # one node's dispatch, as the sweep took it out of each point's views (the
    # Neg chains' difference per node); 0 in a file trained before it was kept, whose views the movement predictor prices
    roof: dict                             # Roof.to_json() the sweep priced its points at: estimates use the same
    points: int = Field(ge=1)
    classes: dict[str, ClassModel]
    host_speed: HostSpeed | None = None    # None in a file trained before it was kept


@dataclass
class Predictor:
    data: PredictorFile
    path: Path

    def kernel_s(self, cls: str, flops: float, bytes_: float, roof_s: float, launches: int, nodes: int,
                 shape: dict | None = None, floor_s: float | None = None) -> float | None:
        """The kernel's predicted seconds (never under its roofline time, or `floor_s` where given), or None where
        the class (`class_key`: with its precision) has no model, the model reads a shape the kernel lacks, or it
        was trained on no kernel of its rank."""
        found = self.data.classes.get(cls)
        if found is None:
            return None
        if (shape or {}).get("rank", 2) != 2 and "rank" not in found.features:
            return None  # a file trained before 1-D convs were swept: it knows 2-D convs only
        x = features(flops, bytes_, roof_s, launches, nodes, cls, shape, tuple(found.features[len(FEATURES):]))
        if x is None:
            return None
        return max(math.exp(_predict(found, x)) * _base_s(roof_s, found.relative_to_roof_plus_s),
                   roof_s if floor_s is None else floor_s)

    def for_method(self, method: str | None) -> Predictor:
        """This predictor with only the classes a plan of `method` runs as swept, under the keys an estimate asks for:
        the FP32 ones, and the INT8 ones swept quantized by that method (`class_key`); None: FP32 only."""
        kept = {}
        for key, model in self.data.classes.items():
            plain, swept_by = _method(key, self.data.target)
            if swept_by is None or (method and swept_by == method):
                kept[plain] = model   # `matmul@int8~static` answers as `matmul@int8` for a static plan
        return Predictor(self.data.model_copy(update={"classes": kept}), self.path)

    def roof(self):
        """The roof the sweep's points were priced at (a predictor's roofline feature is only comparable at it)."""
        from tapeout.estimation import roofline

        return roofline.Roof.from_json(self.data.roof, self.data.device,
                                       f"the roof the sweep behind {self.path.name} was priced at")

    def band(self, classes: set[str]) -> tuple[float, float]:
        """The widest held-out band over the classes a model's kernels fall in."""
        bands = [self.data.classes[c].band for c in classes if c in self.data.classes] or [(0.0, 0.0)]
        return min(b[0] for b in bands), max(b[1] for b in bands)


def _predict(model: ClassModel, x: list[float]) -> float:
    total = 0.0
    for tree in model.trees:
        node = 0
        while tree.left[node] != -1:
            node = tree.left[node] if x[tree.feature[node]] <= tree.threshold[node] else tree.right[node]
        total += tree.value[node]
    return model.init + model.rate * total


def _base_s(roof_s: float, relative_to_roof_plus_s: float | None) -> float:
    """What a class model's prediction is relative to (`ClassModel.relative_to_roof_plus_s`): 1 s, or a kernel's
    roofline seconds plus the model's offset."""
    if relative_to_roof_plus_s is None:
        return 1.0
    return max(roof_s + relative_to_roof_plus_s, FLOOR_S)


def _export(regressor) -> ClassModel:
    trees = []
    for (estimator,) in regressor.estimators_:
        t = estimator.tree_
        trees.append(Tree(feature=[int(f) for f in t.feature], threshold=[float(v) for v in t.threshold],
                          left=[int(v) for v in t.children_left], right=[int(v) for v in t.children_right],
                          value=[float(v) for v in t.value[:, 0, 0]]))
    return ClassModel(init=float(regressor.init_.constant_.ravel()[0]), rate=regressor.learning_rate, trees=trees,
                      band=(0.0, 0.0), points=1, held_out_within_15=0.0)


def _regressor():
    from sklearn.ensemble import GradientBoostingRegressor

    # 300 trees of depth 4: on the 1-thread sweep here (9,456 points) the held-out share within ±15 % rose from 50 to
    # 56 % for convs and 60 to 65 % for movement over 150 of depth 3, and no class lost; deeper or more gained ≤ 1 point
    return GradientBoostingRegressor(n_estimators=300, max_depth=4, learning_rate=0.05, subsample=0.9, random_state=0)


def cache_floor_s(flops: float, bytes_: float, roof, precision: str = "fp32") -> float:
    """A point's roofline time with its bytes at the rate of the cache level they fit in (DRAM's past the last):
    the floor an estimate puts under a prediction (`estimate.floor_s`), for a one-kernel model whose working set is
    its own. `roof`: a roofline.Roof with the host's measured cache bandwidths (without them, its DRAM roofline)."""
    peak = roof.peak(precision)[0]
    rate = max(roof.bandwidth_at(bytes_) or 0.0, roof.bandwidth or 0.0)
    return max(flops / peak if peak else 0.0, bytes_ / rate if rate else 0.0)


def train(points: list[dict], folds: int = 5, roof=None, target: str = "onnxruntime",
          dispatch_s: float | None = None) -> dict[str, ClassModel]:
    """A model per class with at least MIN_POINTS points, each with its held-out band. With `dispatch_s` a class
    learns, of its seconds and its seconds over its roofline plus that dispatch (`ClassModel.relative_to_roof_plus_s`),
    the ratio unless its seconds' held-out points come within ±15 % of theirs clearly more often (`seconds_form_wins`):
    the 1-thread sweep here put FP32 convs at 65 % against 53. Each point's time is floored at its roofline
    time (`roof_s`, DRAM's), or with the sweep's `roof` at its cache level's (`cache_floor_s`): the swept kernels run
    cache-hot, and GEMVs of ~340 KB measured at ~3 µs were learned at their DRAM roofline's 7.8."""
    by_class: dict[str, list[dict]] = {}
    for p in points:
        by_class.setdefault(class_key(p["cls"], p.get("precision", "fp32"), p.get("quantization"), target),
                            []).append(p)
    out = {}
    for cls, rows in sorted(by_class.items()):
        names = SHAPE_FEATURES.get(base_class(cls), ())
        vectors = [features(r["flops"], r["bytes"], r["roof_s"], r["launches"], r["nodes"], cls, r.get("shape"))
                   for r in rows]
        rows = [r for r, v in zip(rows, vectors, strict=True) if v is not None]
        if len(rows) < MIN_POINTS:
            continue
        x = np.array([v for v in vectors if v is not None])
        floors = np.array([cache_floor_s(r["flops"], r["bytes"], roof, r.get("precision", "fp32")) if roof is not None
                           else r["roof_s"] for r in rows])
        seconds = np.maximum([max(r["kernel_s"], FLOOR_S) for r in rows], floors)
        tried = []
        for offset in ([dispatch_s, None] if dispatch_s is not None else [None]):
            bases = np.array([_base_s(r["roof_s"], offset) for r in rows])
            errors = _held_out(x, np.log(seconds / bases), bases, floors, folds)
            tried.append((offset, bases, errors))
        chosen = tried[0]  # the ratio where a dispatch is given, else the seconds alone
        if len(tried) == 2 and seconds_form_wins(np.abs(tried[0][2]) <= 0.15, np.abs(tried[1][2]) <= 0.15):
            chosen = tried[1]
        offset, bases, errors = chosen
        within = float(np.mean(np.abs(errors) <= 0.15))
        model = _export(_regressor().fit(x, np.log(seconds / bases)))
        model.band = (float(np.percentile(errors, 10)), float(np.percentile(errors, 90)))
        model.points = len(rows)
        model.held_out_within_15 = within
        model.features = [*FEATURES, *names]
        model.relative_to_roof_plus_s = offset
        out[cls] = model
    return out


def seconds_form_wins(ratio_within: np.ndarray, seconds_within: np.ndarray) -> bool:
    """Whether a class learns its seconds rather than its ratio to its roofline plus the dispatch, given which of its
    held-out points each form predicted within ±15 % (the same points, in order): only where the seconds win on more
    points than they lose by over twice the spread of that difference under a tie (McNemar's: the root of the points
    the two forms disagree on). On a near-tie the ratio stays: a 1-thread sweep's recurrent class sat at 75 % either
    way, and the larger share flipped when unrelated MatMul points moved the median dispatch by 0.4 ns, moving a toy
    LSTM's estimate 15 %."""
    wins = int(np.sum(seconds_within & ~ratio_within))
    losses = int(np.sum(ratio_within & ~seconds_within))
    return wins - losses > 2 * math.sqrt(wins + losses)


def _held_out(x: np.ndarray, y: np.ndarray, bases: np.ndarray, floors: np.ndarray, folds: int) -> np.ndarray:
    """Each point's relative error predicted by a model trained on the other folds (`y`: log of its seconds over
    its base)."""
    errors = np.empty(len(y))
    order = np.random.default_rng(0).permutation(len(y))
    for fold in range(folds):
        held = order[fold::folds]
        fitted = _export(_regressor().fit(x[np.setdiff1d(order, held)], y[np.setdiff1d(order, held)]))
        for i in held:
            predicted = max(math.exp(_predict(fitted, list(x[i]))) * bases[i], floors[i])
            errors[i] = predicted / (math.exp(y[i]) * bases[i]) - 1
    return errors


def file_name(device: str, target: str) -> str:
    return f"{device}--{target}.predictor.json"


def save(data: PredictorFile, folder: Path) -> Path:
    path = folder / file_name(data.device, data.target)
    write_text(path, json.dumps(data.model_dump(by_alias=True)))
    return path


def load(path: Path, device: str | None = None, target: str | None = None) -> Predictor:
    try:
        data = PredictorFile.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError, RecursionError) as exc:
        raise BadInput(f"the predictor file {path} is malformed ({str(exc).splitlines()[0]})",
                       fix="delete it and sweep again (tapeout calibrate --sweep)") from None
    if data.schema_ != SCHEMA:
        raise BadInput(f"the predictor file {path} has schema {data.schema_!r}, not {SCHEMA}", fix="sweep again")
    if (device and data.device != device) or (target and data.target != target):
        raise BadInput(f"the predictor file {path} is for {data.device} × {data.target}, not {device} × {target}",
                       fix="a predictor is used only for the device and target it was swept on: sweep this one")
    for cls, model in data.classes.items():
        # the generic features and a leading part of the class's shape features: a file trained before a shape
        # feature was added (a conv's layout) reads the ones it has
        if model.features != [*FEATURES, *SHAPE_FEATURES.get(base_class(cls), ())][: len(model.features)] or \
                len(model.features) < len(FEATURES):
            raise BadInput(f"the predictor file {path}: class {cls} reads features {model.features}, which this "
                           "tapeout does not compute", fix="delete it and sweep again (tapeout calibrate --sweep)")
        if any(not _well_formed(tree, len(model.features)) for tree in model.trees):
            raise BadInput(f"the predictor file {path}: a tree of class {cls} is malformed",
                           fix="delete it and sweep again (tapeout calibrate --sweep)")
    try:
        Predictor(data, path).roof()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadInput(f"the predictor file {path}: its roof is malformed ({exc})", fix="delete it and sweep again") from None
    return Predictor(data, path)


def _well_formed(tree: Tree, width: int) -> bool:
    """Every node's children come after it (so a walk ends), a split reads a feature there is, a leaf has none."""
    size = len(tree.left)
    if not size or any(len(v) != size for v in (tree.right, tree.feature, tree.threshold, tree.value)):
        return False
    for i in range(size):
        left, right = tree.left[i], tree.right[i]
        if left == -1 or right == -1:
            if left != right:
                return False
        elif not (i < left < size and i < right < size and 0 <= tree.feature[i] < width):
            return False
    return True


# the targets whose builds an estimate prices by their predictor: ONNX Runtime, whose fusions, layouts and inserted
# nodes the estimate reads (cost units, `runtime_kernels`). Not yet OpenVINO: with the kernels its compiled graph
# runs (`openvino_graph`) its predictor puts the 36 pairs of bench/estimator.py at 12 within ±15 % (the calibration
# on the same kernels: 27), over-predicting the toy models by 20-48 %: a lone kernel's point keeps more of the
# plugin's per-call cost than a kernel in a model pays, and its Neg-chain dispatch reads 0 (the plugin fuses the
# chain into one subgraph). Its sweep and predictor file are kept; `bench/estimator.py --all-targets` scores them
PRICED = ("onnxruntime",)


def find(device: str, target: str, any_target: bool = False) -> Predictor | None:
    """The user's predictor for (device, target), or None; None too for a target an estimate does not price by its
    predictor (`PRICED`), unless `any_target`."""
    from tapeout.estimation.fit import user_folder

    path = user_folder() / file_name(device, target)
    if not path.is_file() or (target not in PRICED and not any_target):
        return None
    return load(path, device, target)

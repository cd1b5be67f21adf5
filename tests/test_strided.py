"""A reorder run element by element (estimation/strided.py): priced by the L1 conflicts of its strided side at what
this host's own strided loop measured, never by its bytes; and OpenVINO's MHA subgraphs as attention kernels, each
profiled layer measured in the class of the kernel it ran."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tapeout.estimation import cost_units as kern
from tapeout.estimation import fit as calib
from tapeout.estimation import openvino_graph as ov_graph
from tapeout.estimation import roofline, strided
from tapeout.graph.view import GraphView

# 64 sets of 12 ways of 64-byte lines (48 KiB, the L1d of the AMD EPYC these figures were taken on)
TABLE = ((0.1, 0.7e-9), (1.0, 0.8e-9), (2.0, 4.3e-9), (4.0, 6.7e-9), (6.0, 6.4e-9))
L1 = strided.Strided(64, 12, 64, TABLE)


def test_the_worst_sets_lines_over_its_ways():
    """C channels a plane apart: a plane of whole set strides (4 KiB here) puts every line in one set; a 6.4 KiB plane
    spreads 64 lines over 16 sets; 16 channels of a 1 KiB plane fall in 4 sets, 4 lines each."""
    assert L1.ratio(64, 16384) == pytest.approx(64 / 12) and L1.ratio(64, 4096) == pytest.approx(64 / 12)
    assert L1.ratio(64, 6400) == pytest.approx(4 / 12)
    assert L1.ratio(16, 1024) == pytest.approx(4 / 12)
    assert L1.ratio(64, 1024) == pytest.approx(16 / 12)   # 64 lines in the same 4 sets
    assert L1.ratio(1, 0) == 0.0
    # seconds: the table read at the ratio, per element; past its ends, its end values
    assert L1.seconds(1000, 64, 16384) == pytest.approx(1000 * (6.7e-9 + (64 / 12 - 4) / 2 * (6.4e-9 - 6.7e-9)))
    assert L1.seconds(1000, 1, 0) == pytest.approx(1000 * 0.7e-9)
    assert L1.seconds(10, 512, 4096) == pytest.approx(10 * 6.4e-9)
    assert strided.UNMEASURED.seconds(1000, 64, 4096) == 0.0 and strided.UNMEASURED.to_json() is None
    assert strided.Strided.from_json(L1.to_json()) == L1


def test_a_layouts_strided_side():
    assert strided.layout_streams([1, 64, 32, 32], "acdb", "abcd", 4) == (64, 4096)
    assert strided.layout_streams([1, 64, 32, 32], "abcd", "acdb", 1) == (64, 1024)
    assert strided.layout_streams([1, 250, 256], "acb", "abc", 4) == (250, 1024)
    assert strided.layout_streams([1, 64, 32, 32], "abcd", "aBcd16b", 4) == (1, 0)   # a blocked layout: one stream
    assert strided.layout_streams([4, 8], "ab", "ba", 4) == (1, 0)


def test_the_l1_geometry_is_read_from_sysfs_or_not_at_all(tmp_path):
    for index, (level, kind, sets) in enumerate((("1", "Instruction", 64), ("1", "Data", 64), ("2", "Unified", 1024))):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, value in (("level", level), ("type", kind), ("ways_of_associativity", "12"),
                            ("coherency_line_size", "64"), ("number_of_sets", str(sets))):
            (folder / name).write_text(value + "\n")
    assert strided.l1_geometry(tmp_path) == (64, 12, 64)
    (tmp_path / "index1" / "ways_of_associativity").write_text("many\n")
    assert strided.l1_geometry(tmp_path) is None
    assert strided.l1_geometry(tmp_path / "absent") is None


def test_this_hosts_strided_loop_is_measured_where_sysfs_gives_its_l1():
    found = strided.measured()
    if strided.l1_geometry() is None:
        assert found is strided.UNMEASURED
        return
    ratios = [r for r, _ in found.table]
    assert ratios == sorted(ratios) and ratios[0] < 1 and ratios[-1] >= 4
    assert all(0 < s < 1e-6 for _, s in found.table)   # seconds per element: ns, not µs


def test_openvino_generic_reorders_are_strided_kernels_profiled_as_such():
    assert kern.op_class("Reorder", "CPU:reorder_f32") == "strided"
    assert kern.op_class("Reorder", "reorder_I8") == "strided"
    assert kern.op_class("Reorder", "CPU:reorder_brgemm_f32") == "movement"
    assert kern.op_class("Reorder", "CPU:jit_uni_f32") == "movement"
    assert kern.op_class("Reorder") == "movement" and kern.op_class("Conv", "CPU:reorder_f32") == "conv"
    generic = ov_graph.Layer("add_acdb_abcd_Reshape", "Reorder", (), 4.0 * 65536, "reorder_f32", (65536, 64, 4096))
    kernel = ov_graph.reorder_kernel(generic)
    assert kernel.cls == "strided" and dict(kernel.shape) == {"elements": 65536, "lines": 64, "stride": 4096}
    assert kernel.bytes == 2 * 4.0 * 65536 and kernel.runs_as == "add_acdb_abcd_Reshape"
    jit = ov_graph.reorder_kernel(ov_graph.Layer("x_abcd_acdb", "Reorder", (), 256.0, "jit_uni_f32"))
    assert jit.cls == "movement" and jit.bytes == 512.0


def test_a_strided_kernel_is_priced_at_the_loop_not_its_bytes():
    """unet-m's reorder of 64 channels of a 32 × 32 plane: 0.5 MB read and written, 22 µs at 24 GB/s; 65,536 elements at the
    loop's 6.4 ns past 5× the ways are 0.4 ms (OpenVINO's own profile here: 0.40 ms)."""
    kernel = kern.Kernel("Reorder r", "strided", "fp32", 0, 2 * 4.0 * 65536, 1,
                         shape=(("elements", 65536), ("lines", 64), ("stride", 4096)))
    roof = roofline.Roof("host-x", "cpu", {"fp32": 1e11}, 24e9, "test", strided=L1)
    assert kern.roof_times(kernel, roof)[1] == pytest.approx(L1.seconds(65536, 64, 4096))
    assert kern.roof_times(kernel, roof)[1] > 15 * kernel.bytes / 24e9
    # a roof without the loop (a device spec, a calibration from before it): its bytes
    for bare in (roofline.Roof("spec", "gpu", {"fp32": 1e13}, 1e12, "spec"),
                 roofline.Roof("host-x", "cpu", {"fp32": 1e11}, 24e9, "test", strided=strided.UNMEASURED)):
        assert kern.roof_times(kernel, bare)[1] == pytest.approx(kernel.bytes / bare.bandwidth)
    # the roof keeps its loop through its JSON (a calibration's, a report's)
    again = roofline.Roof.from_json(json.loads(json.dumps(roof.to_json())))
    assert again.strided == L1
    assert "strided" not in roofline.Roof("host-x", "cpu", {"fp32": 1e11}, 24e9, "t", strided=strided.UNMEASURED
                                          ).to_json()


def _record(model, measured_strided, counts_strided=1):
    return calib.Record(model=model, precision="fp32", source=model, created="", p50_s=1e-3, tails={},
                        roof_s={"conv@fp32": 4e-4, "strided@fp32": 2e-4},
                        measured_s={"conv": 5e-4, "strided": measured_strided}, kernels=2,
                        counts={"conv": 1, "strided": counts_strided})


def test_the_fit_never_scales_a_strided_kernels_measured_loop():
    """Its roof is the host's own time for its access pattern: priced as it is, and its measured time (one model's,
    in the benchmark) never leaks into another class's fit."""
    fitted = calib.fit([_record("a", 2e-4), _record("b", 9e-4)])
    assert "strided" not in fitted.per_class and fitted.terms("strided", "fp32") == (0.0, 1.0)
    assert not any(key.startswith("strided") for key in fitted.per_class)
    assert fitted.kernel_s("strided", "fp32", 3e-4) == pytest.approx(
        fitted.per_kernel_s + (1 + fitted.outside_share) * 3e-4)


def test_a_malformed_strided_record_is_refused():
    from pydantic import ValidationError

    for bad in ({"sets": 0, "ways": 12, "line": 64, "ns_per_element": [[1, 2]]},
                {"sets": 64, "ways": 12, "line": 64, "ns_per_element": []},
                {"sets": 64, "ways": 12, "line": 64, "ns_per_element": [[1, float("nan")]]},
                {"sets": 64, "ways": 12, "line": 64, "ns_per_element": [[1, 2]], "extra": 1}):
        with pytest.raises(ValidationError):
            strided.Strided.from_json(bad)


def _attention_model(path):
    """q = x Wq, k = x Wk: scores = q kᵀ (two activations), softmax, then scores x (two activations again)."""
    rng = np.random.default_rng(0)
    weights = [helper.make_tensor(n, TensorProto.FLOAT, [16, 16], rng.standard_normal(256).tolist())
               for n in ("wq", "wk")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
             helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[1, 0]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
             helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["y"], name="weighted")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_attention_is_the_kernels_of_matmuls_between_two_activations(tmp_path):
    from tapeout.core.schemas import InputSpec

    view = GraphView.load(_attention_model(tmp_path / "a.onnx"), [InputSpec(name="x", shape=[8, 16])], {})
    node_kernel = {n.name: n.name for n in view.nodes}
    assert ov_graph.attention_kernels(view, node_kernel) == {"scores", "weighted"}
    kernels = [kern.Kernel(n, c, "fp32", flops, 64.0, 1) for n, c, flops in
               (("q_proj", "matmul", 4096), ("k_proj", "matmul", 4096), ("kt", "movement", 0),
                ("scores", "matmul", 2048), ("softmax", "reduce", 320), ("weighted", "matmul", 4096))]
    layers = [ov_graph.Layer("q_fc", "FullyConnected", ("q_proj",), 0.0),
              ov_graph.Layer("k_fc", "FullyConnected", ("k_proj",), 0.0),
              ov_graph.Layer("mha", "Subgraph", ("kt", "softmax", "weighted"), 0.0)]
    found = {k.name: k for k in ov_graph.executed_kernels(kernels, node_kernel, layers,
                                                          {"q_proj", "k_proj", "kt", "softmax", "weighted"},
                                                          ov_graph.attention_kernels(view, node_kernel))}
    # the MHA subgraph (its scores' matmul named nowhere, kept) is attention; the projections stay matmuls
    assert found["weighted"].cls == "attention" and found["weighted"].runs_as == "mha"
    assert found["scores"].cls == "attention" and found["scores"].runs_as == ""
    assert found["q_proj"].cls == "matmul" and found["q_proj"].runs_as == "q_fc"
    # a matmul between activations the plugin runs as a MatMul layer of its own stays a matmul (at its rate)
    alone = [ov_graph.Layer("mm", "MatMul", ("weighted",), 0.0)]
    assert ov_graph.executed_kernels(kernels, node_kernel, alone, {"weighted"}, frozenset({"weighted"}))[0].cls == \
        "matmul"


def test_each_profiled_layer_is_measured_in_the_class_of_the_kernel_it_ran():
    """OpenVINO profiles an MHA subgraph as a "Subgraph" (elementwise by its type) and a generic reorder as a
    "Reorder" run by "reorder_f32": measured as the attention and strided kernels the compiled graph says they are,
    so a class's measured time is the time of the kernels its roof was priced for."""
    from tapeout.estimation import estimate

    profile = {"runs": 10,
               "op_types": [{"op_type": "Subgraph", "provider": "CPU:jit_avx512_f32", "total_us": 2000.0},
                            {"op_type": "Reorder", "provider": "CPU:reorder_f32", "total_us": 500.0},
                            {"op_type": "Reorder", "provider": "CPU:jit_uni_f32", "total_us": 30.0}],
               "ops": [{"node": "mha", "op_type": "Subgraph", "total_us": 1800.0},
                       {"node": "gelu", "op_type": "Subgraph", "total_us": 200.0},
                       {"node": "c_acdb_abcd_r", "op_type": "Reorder", "total_us": 500.0},
                       {"node": "x_abcd_acdb_c", "op_type": "Reorder", "total_us": 30.0}]}
    kernels = [kern.Kernel("av", "attention", "fp32", 1, 1.0, 1, runs_as="mha"),
               kern.Kernel("act", "elementwise", "fp32", 1, 1.0, 1, runs_as="gelu"),
               kern.Kernel("Reorder c_acdb_abcd_r", "strided", "fp32", 0, 1.0, 1, runs_as="c_acdb_abcd_r"),
               kern.Kernel("Reorder x_abcd_acdb_c", "movement", "fp32", 0, 1.0, 1, runs_as="x_abcd_acdb_c")]
    by_layer = estimate.profiled_classes(profile, kernels)
    assert by_layer == pytest.approx({"attention": 180e-6, "elementwise": 20e-6, "strided": 50e-6, "movement": 3e-6})
    # kernels that name no layer (ONNX Runtime's): by each type and implementation, the generic reorder still strided
    by_type = estimate.profiled_classes(profile, [kern.Kernel("av", "matmul", "fp32", 1, 1.0, 1)], scale=0.5)
    assert by_type == pytest.approx({"elementwise": 100e-6, "strided": 25e-6, "movement": 1.5e-6})

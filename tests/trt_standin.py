"""A stand-in `tensorrt` module, for checking tapeout's side of the TensorRT contract where TensorRT
cannot be installed (its builder is not on the public package index; it needs an NVIDIA GPU).

It is not TensorRT and proves nothing about engines. What it does:
- Its names are the real API's: every class, method (with each overload's parameters), property and
  enum member comes from NVIDIA's own type stubs (tests/data/tensorrt-api-10.13.json, extracted by
  tests/data/extract_tensorrt_api.py), with the TensorRT 11 removals applied (research nvidia.md §1.4:
  precision builder flags, calibrators, algorithm selectors, EXPLICIT_BATCH, ...). Touching a name the
  API does not have raises AttributeError; a call no overload accepts raises TypeError.
- It records every call, so a test can assert what tapeout asked of the builder.
- Its "engine" is JSON naming what was configured; its inspector describes one layer per compute node
  of the parsed ONNX, in the precision the graph asks for (or in `layer_precision`, to test tapeout's
  check of the built engine's precision).
"""

from __future__ import annotations

import functools
import json
import sys
import types
from pathlib import Path

API = json.loads((Path(__file__).parent / "data" / "tensorrt-api-10.13.json").read_text())["api"]
REMOVED_IN_11 = {
    "BuilderFlag": {
        "FP16",
        "BF16",
        "INT8",
        "FP8",
        "INT4",
        "FP4",
        "OBEY_PRECISION_CONSTRAINTS",
        "PREFER_PRECISION_CONSTRAINTS",
        "REJECT_EMPTY_ALGORITHMS",
    },
    "IBuilderConfig": {
        "int8_calibrator",
        "set_calibration_profile",
        "get_calibration_profile",
        "quantization_flags",
        "set_quantization_flag",
        "clear_quantization_flag",
        "get_quantization_flag",
        "algorithm_selector",
    },
    "ICudaEngine": {"device_memory_size", "get_device_memory_size_for_profile"},
    "NetworkDefinitionCreationFlag": {"EXPLICIT_BATCH"},
    "Builder": {"platform_has_fast_fp16", "platform_has_fast_int8"},
    "TacticSource": {"CUBLAS", "CUBLAS_LT", "CUDNN"},
}
REMOVED_CLASSES_11 = {
    "IInt8Calibrator",
    "IInt8EntropyCalibrator",
    "IInt8EntropyCalibrator2",
    "IInt8MinMaxCalibrator",
    "IInt8LegacyCalibrator",
    "CalibrationAlgoType",
    "QuantizationFlag",
    "IAlgorithmSelector",
    "IAlgorithm",
    "IAlgorithmContext",
    "IAlgorithmIOInfo",
    "IAlgorithmVariant",
}


class StandIn:
    """Settings and the call record of one installed stand-in."""

    def __init__(self, version: str):
        self.version = version
        self.major = int(version.split(".")[0])
        self.calls: list[tuple[str, tuple, dict]] = []
        self.refuse_ops: set[str] = set()  # op types the "parser" rejects
        self.layer_precision: str | None = (
            None  # force every layer's type in the inspector ("Float": a silent FP32 engine)
        )
        self.fail_build = False

    def called(self, name: str) -> list[tuple]:
        return [(args, kwargs) for n, args, kwargs in self.calls if n == name]


class Enum:
    def __init__(self, owner: str, name: str, value: int):
        self.owner, self.name, self.value = owner, name, value

    def __int__(self) -> int:
        return self.value

    __index__ = __int__

    def __repr__(self) -> str:
        return f"<{self.owner}.{self.name}: {self.value}>"


def _accepts(overloads: list[dict], args: tuple, kwargs: dict) -> bool:
    for sig in overloads:
        params, required = sig["params"], len(sig["params"]) - sig["defaults"]
        if sig["varargs"]:
            return True
        if len(args) > len(params) or set(kwargs) - set(params) - set(sig["kwonly"]):
            continue
        given = set(params[: len(args)]) | set(kwargs)
        if set(params[:required]) <= given:
            return True
    return False


def install(version: str = "11.4.0.106") -> tuple[types.ModuleType, StandIn]:
    """A fresh stand-in module, put in sys.modules as `tensorrt` (the caller removes it)."""
    state = StandIn(version)
    module = types.ModuleType("tensorrt")
    module.__version__ = version
    module.__doc__ = __doc__
    removed = REMOVED_IN_11 if state.major >= 11 else {}

    class Checked:
        """Attribute access and calls checked against the API; behaviour from `_impl_<name>` where a test needs it."""

        _api: str = ""

        def __init__(self, *args, **kwargs):
            _check(self._api, "__init__", args, kwargs)
            state.calls.append((f"{self._api}.__init__", args, kwargs))
            object.__setattr__(self, "_values", {})
            impl = getattr(self, "_impl___init__", None)
            if impl:
                impl(*args, **kwargs)

        def __getattr__(self, name: str):
            members = API[self._api]["members"]
            if name.startswith("_") or name not in members or name in removed.get(self._api, ()):
                raise AttributeError(
                    f"'tensorrt.{self._api}' object has no attribute '{name}' (stand-in: not in the "
                    f"TensorRT {version} API)"
                )
            kind = members[name]["kind"]
            if kind == "method":
                impl = getattr(type(self), f"_impl_{name}", None)

                def call(*args, **kwargs):
                    _check(self._api, name, args, kwargs)
                    state.calls.append((f"{self._api}.{name}", args, kwargs))
                    return impl(self, *args, **kwargs) if impl else None

                return call
            values = self.__dict__.get("_values", {})
            if name in values:
                return values[name]
            getter = getattr(type(self), f"_get_{name}", None)
            return getter(self) if getter else None

        def __setattr__(self, name: str, value) -> None:
            if type(self).__module__ != __name__ or name.startswith("_"):  # a user subclass keeps its own attributes
                object.__setattr__(self, name, value)
                return
            members = API[self._api]["members"]
            if name not in members or members[name]["kind"] == "method" or name in removed.get(self._api, ()):
                raise AttributeError(f"'tensorrt.{self._api}' has no settable attribute '{name}' (stand-in)")
            state.calls.append((f"{self._api}.{name}=", (value,), {}))
            self.__dict__["_values"][name] = value

    def _check(cls: str, name: str, args: tuple, kwargs: dict) -> None:
        member = API[cls]["members"].get(name)
        if member is None and name == "__init__":
            return  # classes without a documented constructor (created by the API itself)
        if member is None or member.get("kind") != "method" or not _accepts(member["overloads"], args, kwargs):
            raise TypeError(
                f"tensorrt.{cls}.{name}{args}: no overload of the TensorRT {version} API takes these "
                f"arguments (stand-in)"
            )

    behaviours = _behaviours(state, module)
    for cls_name, spec in API.items():
        if cls_name == "<module>" or cls_name in (REMOVED_CLASSES_11 if state.major >= 11 else ()):
            continue
        body = {"_api": cls_name, **behaviours.get(cls_name, {})}
        cls = type(cls_name, (Checked,), body)
        cls.__module__ = __name__
        for i, (member, info) in enumerate(sorted(spec["members"].items())):
            if info["kind"] == "enum" and member not in removed.get(cls_name, ()):
                setattr(cls, member, Enum(cls_name, member, i))
        setattr(module, cls_name, cls)
    for fn in API.get("<module>", {}).get("members", {}):
        setattr(module, fn, functools.partial(lambda n, *a, **k: state.calls.append((n, a, k)), fn))
    module._standin = state
    sys.modules["tensorrt"] = module
    return module, state


def _behaviours(state: StandIn, trt) -> dict[str, dict]:
    """What the calls tapeout makes return: just enough to walk build, inspect and cache."""

    def host_memory(data: bytes):
        memory = trt.IHostMemory()
        object.__setattr__(memory, "_data", data)
        return memory

    def builder_init(self, logger):
        object.__setattr__(self, "_logger", logger)

    def create_network(self, flags=0):
        network = trt.INetworkDefinition()
        object.__setattr__(network, "_flags", int(flags))
        return network

    def build_serialized_network(self, network, config):
        if state.fail_build:
            self._logger.log(trt.ILogger.ERROR, "stand-in: no implementation found for layer conv1")
            return None
        payload = {
            "nodes": network._nodes,
            "flags": sorted(config._flags),
            "values": {k: str(v) for k, v in config.__dict__["_values"].items()},
            "profiles": config._profiles,
            "network_flags": network._flags,
        }
        return host_memory(json.dumps(payload).encode())

    def parser_init(self, network, logger):
        object.__setattr__(self, "_network", network)
        object.__setattr__(self, "_errors", [])

    def parse_from_file(self, model):
        import onnx

        graph = onnx.load(model, load_external_data=False).graph
        dq = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
        fp16 = any(i.data_type == onnx.TensorProto.FLOAT16 for i in graph.initializer)
        nodes = [
            {"name": n.name, "op": n.op_type, "int8": bool(dq & set(n.input)), "fp16": fp16}
            for n in graph.node
            if n.op_type in ("Conv", "Gemm", "MatMul", "ConvTranspose")
        ]
        object.__setattr__(self._network, "_nodes", nodes)
        for n in graph.node:
            if n.op_type in state.refuse_ops:
                error = trt.ParserError()
                object.__setattr__(error, "_node", n)
                self._errors.append(error)
        return not self._errors

    def config_init(self):
        object.__setattr__(self, "_flags", set())
        object.__setattr__(self, "_profiles", [])
        object.__setattr__(self, "_cache", None)

    def create_builder_config(self):
        config = trt.IBuilderConfig()
        config_init(config)
        return config

    def set_flag(self, flag):
        self._flags.add(flag.name)

    def clear_flag(self, flag):
        self._flags.discard(flag.name)
        self._flags.add(f"-{flag.name}")

    def add_optimization_profile(self, profile):
        self._profiles.append(profile._shapes)
        return len(self._profiles) - 1

    def create_optimization_profile(self):
        profile = trt.IOptimizationProfile()
        object.__setattr__(profile, "_shapes", {})
        return profile

    def set_shape(self, input, min, opt, max):  # the API's parameter names
        self._shapes[input] = [list(min), list(opt), list(max)]

    def create_timing_cache(self, serialized_timing_cache):
        cache = trt.ITimingCache()
        object.__setattr__(cache, "_data", bytes(serialized_timing_cache) + b"+")
        return cache

    def set_timing_cache(self, cache, ignore_mismatch):
        object.__setattr__(self, "_cache", cache)
        return True

    def deserialize_cuda_engine(self, serialized_engine):
        engine = trt.ICudaEngine()
        object.__setattr__(engine, "_payload", json.loads(bytes(serialized_engine)))
        return engine

    def get_engine_information(self, format):
        payload = self._engine._payload
        sparse = "SPARSE_WEIGHTS" in payload["flags"]
        layers = []
        for node in payload["nodes"]:
            kind = state.layer_precision or ("Int8" if node["int8"] else "Half" if node["fp16"] else "Float")
            field = "DataType" if state.major >= 11 else "Format/Datatype"
            layers.append(
                {
                    "Name": node["name"],
                    "LayerType": "CaskConvolution" if "Conv" in node["op"] else "CaskGemm",
                    "Inputs": [{"Name": "in", field: kind}],
                    "Outputs": [{"Name": "out", field: kind}],
                    "TacticName": "sm90_xmma_" + ("sparse_" if sparse else "") + node["op"].lower(),
                }
            )
        return json.dumps({"Layers": layers})

    def create_engine_inspector(self):
        inspector = trt.EngineInspector()
        object.__setattr__(inspector, "_engine", self)
        return inspector

    return {
        "Builder": {
            "_impl___init__": builder_init,
            "_impl_create_network": create_network,
            "_impl_create_builder_config": create_builder_config,
            "_impl_create_optimization_profile": create_optimization_profile,
            "_impl_build_serialized_network": build_serialized_network,
        },
        "OnnxParser": {
            "_impl___init__": parser_init,
            "_impl_parse_from_file": parse_from_file,
            "_get_num_errors": lambda self: len(self._errors),
            "_impl_get_error": lambda self, index: self._errors[index],
        },
        "ParserError": {
            "_impl_node_name": lambda self: self._node.name,
            "_impl_node_operator": lambda self: self._node.op_type,
            "_impl_desc": lambda self: f"stand-in: no importer for op {self._node.op_type}",
        },
        "IBuilderConfig": {
            "_impl_set_flag": set_flag,
            "_impl_clear_flag": clear_flag,
            "_impl_add_optimization_profile": add_optimization_profile,
            "_impl_create_timing_cache": create_timing_cache,
            "_impl_set_timing_cache": set_timing_cache,
            "_impl_get_timing_cache": lambda self: self._cache,
        },
        "IOptimizationProfile": {"_impl_set_shape": set_shape},
        "ITimingCache": {"_impl_serialize": lambda self: host_memory(self._data)},
        "IHostMemory": {"__bytes__": lambda self: self._data, "_get_nbytes": lambda self: len(self._data)},
        "Runtime": {"_impl_deserialize_cuda_engine": deserialize_cuda_engine},
        "ICudaEngine": {
            "_impl_create_engine_inspector": create_engine_inspector,
            "_get_device_memory_size_v2": lambda self: 1 << 20,
        },
        "EngineInspector": {"_impl_get_engine_information": get_engine_information},
    }

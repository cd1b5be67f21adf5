"""The C++ compiler AOTInductor packages are built with (targets/cxx_compiler.py), for real: a compiler that links
libstdc++ statically into shared libraries (a wrapper like the H200 image's CXX=/opt/gcc/bin/g++, whose packages all
crashed when torch loaded them) is probed, found out from the ELF it builds, and passed over for g++; where no
compiler links it as a shared library, one line; the ELF reader says "unknown", never raises, on what is not one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import static_libstdcxx_compiler
from tapeout.core.errors import TargetUnavailable
from tapeout.targets import cxx_compiler

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="no g++ here")


def _shared_library(tmp_path: Path, *flags: str) -> Path:
    source, library = tmp_path / "x.cpp", tmp_path / f"x{len(flags)}.so"
    source.write_text(cxx_compiler.PROBE_SOURCE)
    subprocess.run([GXX, "-shared", "-fPIC", str(source), "-o", str(library), *flags], check=True)
    return library


def test_the_elf_reader_names_what_a_shared_library_loads_and_unknown_for_anything_else(tmp_path):
    dynamic = cxx_compiler.needed_libraries(_shared_library(tmp_path))
    static = cxx_compiler.needed_libraries(_shared_library(tmp_path, "-static-libstdc++", "-static-libgcc"))
    assert any(n.startswith("libstdc++.so") for n in dynamic) and "libc.so.6" in dynamic
    assert not any(n.startswith("libstdc++.so") for n in static) and "libc.so.6" in static
    whole = _shared_library(tmp_path).read_bytes()
    for name, data in {
        "text": b"not a library",
        "truncated": whole[:200],
        "headers cut": whole[: len(whole) // 2],
        "garbage": b"\x7fELF\x02\x01" + os.urandom(4000),
    }.items():
        (tmp_path / name).write_bytes(data)
        assert cxx_compiler.needed_libraries(tmp_path / name) is None, name


def test_a_cxx_that_links_libstdcxx_statically_is_passed_over_for_gxx(tmp_path, monkeypatch):
    wrapper = static_libstdcxx_compiler(tmp_path)
    monkeypatch.setenv("CXX", str(wrapper))
    usable, why = cxx_compiler.probe(str(wrapper))
    assert not usable and "links libstdc++ statically" in why
    chosen = cxx_compiler.choose()
    assert os.path.realpath(chosen.path) == os.path.realpath(GXX) and chosen.inductor_configs() == {
        "cpp.cxx": (chosen.path,)
    }
    assert f"used instead of {wrapper}, which links libstdc++ statically" in chosen.note
    assert chosen.describe().startswith(chosen.version) and chosen.note in chosen.describe()


def test_inductors_own_choice_is_kept_where_it_links_libstdcxx_as_a_shared_library(monkeypatch):
    monkeypatch.setenv("CXX", GXX)
    chosen = cxx_compiler.choose()
    assert chosen.path == GXX and chosen.note == "" and cxx_compiler.probe(GXX) == (True, "")


def test_where_every_compiler_links_it_statically_the_refusal_is_one_line(tmp_path, monkeypatch):
    only = static_libstdcxx_compiler(tmp_path / "bin", name="g++")  # the only compiler on PATH, under g++'s own name
    monkeypatch.setenv("PATH", str(only.parent))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(TargetUnavailable) as refused:
        cxx_compiler.choose()
    message = str(refused.value)
    assert "\n" not in message and f"{only}, which links libstdc++ statically" in message
    assert "apt install g++" in refused.value.fix


def test_with_no_compiler_at_all_choose_says_none_for_the_target_to_explain(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert cxx_compiler.choose() is None

"""The C++ compiler Inductor builds an AOTInductor package's native code with: one whose shared libraries use the
shared libstdc++, so the package can load in a torch process.

Why it is chosen, not taken from $CXX: torch maps the system's shared libstdc++ into every process. A compiler that
links libstdc++ statically (a wrapper adding -static-libstdc++: the NVIDIA H200 image's CXX=/opt/gcc/bin/g++ is one)
gives the package a second copy of it, whose locale state the first never set up, and the package dies on its first
std::regex: SIGSEGV in AOTInductor's parse_device_str on that H200 (every package, fresh process or not), an abort
on std::bad_cast here. So each candidate is probed once per process: a small shared library built with it, and its
ELF dynamic section read for libstdc++.so. Inductor's own choice ($CXX, else g++) goes first; where it fails the
probe, the next of g++, c++ and clang++ that passes is used and the record says why.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tapeout.core.errors import TargetUnavailable

FALLBACKS = ("g++", "c++", "clang++")
PROBE_SOURCE = '#include <string>\nextern "C" unsigned long probe(const char* s) { return std::string(s).size(); }\n'
LIBSTDCXX = "libstdc++.so"


@dataclass(frozen=True)
class Compiler:
    path: str
    version: str
    # why Inductor's own choice was not used ("" where it was)
    note: str = ""

    def inductor_configs(self) -> dict:
        """What `aoti_compile_and_package(inductor_configs=…)` takes to build with this compiler."""
        return {"cpp.cxx": (self.path,)}

    def describe(self) -> str:
        return f"{self.version} ({self.path})" + (f"; {self.note}" if self.note else "")


def inductor_default() -> str | None:
    """The compiler Inductor would call by itself: $CXX, else g++ (its config reads $CXX when torch imports it)."""
    for name in (os.environ.get("CXX"), "g++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def choose() -> Compiler | None:
    """The compiler to build packages with (None where there is none at all: the caller says how to install one).
    Raises TargetUnavailable where compilers exist but each links libstdc++ statically."""
    first = inductor_default()
    tried: list[str] = []
    seen: set[str] = set()
    for name in (first, *FALLBACKS):
        path = shutil.which(name) if name else None
        if path is None or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        usable, why = probe(path)
        if usable:
            note = f"used instead of {'; '.join(tried)}" if tried else ""
            return Compiler(path, version(path), note)
        tried.append(f"{path}, which {why}")
    if not tried:
        return None
    raise TargetUnavailable(
        f"no C++ compiler here builds packages torch can load: {'; '.join(tried)}",
        fix="install g++ (apt install g++) or point CXX at a compiler that links libstdc++ as a shared library",
    )


@functools.lru_cache(maxsize=16)
def probe(path: str) -> tuple[bool, str]:
    """(whether `path` builds shared libraries that use the shared libstdc++, what it does instead). On a platform
    whose binaries are not ELF (macOS: libc++ in both), nothing is checked."""
    if not sys.platform.startswith("linux"):
        return True, "not checked off Linux"
    with tempfile.TemporaryDirectory(prefix="tapeout-cxx-") as tmp:
        source, library = Path(tmp) / "probe.cpp", Path(tmp) / "probe.so"
        source.write_text(PROBE_SOURCE)
        try:
            done = subprocess.run(
                [path, "-shared", "-fPIC", "-O1", str(source), "-o", str(library)],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return False, f"could not be run ({exc})"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return False, f"failed to build a shared library ({last[:200]})"
        needed = needed_libraries(library)
    if needed is None:
        return True, "not checked (not a 64-bit little-endian ELF)"
    if any(name.startswith(LIBSTDCXX) for name in needed):
        return True, ""
    return False, (
        f"links libstdc++ statically (a shared library it builds needs only {', '.join(needed) or 'nothing'}), "
        "so its packages would carry a second libstdc++ and crash in a torch process"
    )


def needed_libraries(path: Path) -> list[str] | None:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared library (None for anything else): which shared
    libraries it loads, read from its dynamic section, nothing executed."""
    data = Path(path).read_bytes()
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    try:
        return _dt_needed(data)
    except (struct.error, IndexError, ValueError):  # truncated or malformed: nothing can be said
        return None


def _dt_needed(data: bytes) -> list[str] | None:
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(shnum):
        at = shoff + i * shentsize
        if at + 64 > len(data):
            return None
        (kind,) = struct.unpack_from("<I", data, at + 4)
        offset, size = struct.unpack_from("<QQ", data, at + 0x18)
        (link,) = struct.unpack_from("<I", data, at + 0x28)
        sections.append((kind, offset, size, link))
    names, dynamic = [], False
    for kind, offset, size, link in sections:
        if kind != 6 or link >= len(sections):  # SHT_DYNAMIC, its string table named by sh_link
            continue
        dynamic = True
        strtab = sections[link][1]
        for at in range(offset, min(offset + size, len(data) - 15), 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                end = data.find(b"\0", strtab + value)
                if end < 0:
                    raise ValueError("unterminated name")
                names.append(data[strtab + value : end].decode("utf-8", "replace"))
    return names if dynamic else None  # no dynamic section to read (section headers stripped): unknown


def version(path: str) -> str:
    try:
        line = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return path
    return line.strip()

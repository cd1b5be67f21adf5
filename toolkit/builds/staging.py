"""Atomic writes: a build is staged in a hidden sibling directory and swapped into place only when complete.

A build that dies leaves at most a `.NAME.partial-PID` directory, never a build dir that looks complete,
and the next build into the same place removes it. `manifest.json` is written last, so a directory
without one is not a build.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from tapeout.core.errors import BadInput, TargetUnavailable
from tapeout.core.files import disk_full, free_bytes, name_max, nearest_existing, out_of_space
from tapeout.core.paths import resolved

MANIFEST = "manifest.json"


# The staging and set-aside names of a build dir NAME: `.NAME.partial-PID` and `.NAME.old-PID`.
_SIDE_DIR = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|old)-(?P<pid>[0-9]+)$")


_SUFFIX_ROOM = len(".") + len(".partial-") + 10  # what staging adds to the build dir's name (a PID is <= 10 digits)


_DISK_FULL_BYTES = 1 << 20  # under a MiB free after a failed build: the disk filling is the likeliest cause


class StagedBuild:
    """`with StagedBuild(out) as staging:` — write into `staging`; on success it becomes `out`.

    The swap is one atomic exchange of two directories (Linux renameat2 RENAME_EXCHANGE), so `out` is
    always a whole build, the old one or the new one; the old one is then deleted from the staging
    name. Where the filesystem cannot exchange, the old build is first set aside as `.NAME.old-PID`,
    and the next build puts it back if a kill came between the two renames. Each build also removes
    the staging dirs of builds that died (their process is gone)."""

    def __init__(self, final: Path, log: Callable[[str], None] | None = None):
        self.final = resolved(final, "build dir", "choose another --out directory")
        self.log = log or (lambda text: None)
        name_bytes = len(os.fsencode(self.final.name))
        limit = name_max(self.final.parent) - _SUFFIX_ROOM
        if name_bytes > limit:
            raise BadInput(
                f"build dir name '{self.final.name[:40]}…' is {name_bytes} bytes; this filesystem allows "
                f"{limit} with the staging suffix",
                fix="choose a shorter --out name",
            )
        existing = nearest_existing(self.final)
        if not existing.is_dir():
            where = "is a file" if existing == self.final else f"is under {existing}, which is a file"
            raise BadInput(f"build dir {self.final} {where}", fix="choose another --out directory")
        if self.final.exists() and not is_build_dir(self.final) and any(self.final.iterdir()):
            raise BadInput(
                f"{self.final} exists and is not a tapeout build dir",
                fix="choose another --out directory, or remove it",
            )
        if not os.access(existing, os.W_OK):
            raise BadInput(
                f"cannot write the build dir {self.final}: {existing} is read-only",
                fix="pass --out a directory you can write",
            )
        self.staging = self.final.parent / f".{self.final.name}.partial-{os.getpid()}"

    def __enter__(self) -> Path:
        try:
            self.final.parent.mkdir(parents=True, exist_ok=True)
            for line in recover(self.final):
                self.log(line)
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging.mkdir()
        except OSError as exc:
            if out_of_space(exc):
                raise disk_full(self.final.parent, exc) from None
            raise BadInput(
                f"cannot write the build dir {self.final}: {exc.strerror or exc}",
                fix="pass --out a directory you can write",
            ) from None
        return self.staging

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            full = not isinstance(exc, KeyboardInterrupt | SystemExit) and _disk_full(self.staging)
            shutil.rmtree(self.staging, ignore_errors=True)
            # A full disk surfaces as whatever wrote last: an OSError, or a runtime's "serialization failed"
            if out_of_space(exc) or (full and not isinstance(exc, TargetUnavailable)):
                raise disk_full(self.final.parent, exc) from exc
            return
        if not (self.staging / MANIFEST).is_file():
            shutil.rmtree(self.staging, ignore_errors=True)
            raise RuntimeError("internal: a staged build was committed without its manifest")
        try:
            self._commit()
        except OSError as exc:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise BadInput(
                f"cannot put the build in place at {self.final}: {exc.strerror or exc}",
                fix="pass --out a directory you can write",
            ) from None

    def _commit(self) -> None:
        if not self.final.exists():
            os.replace(self.staging, self.final)
        elif exchange(self.staging, self.final):
            shutil.rmtree(self.staging, ignore_errors=True)  # now the old build; a kill here leaves it to `recover`
        else:
            old = self.final.parent / f".{self.final.name}.old-{os.getpid()}"
            os.replace(self.final, old)  # a kill between these two renames is undone by the next build's `recover`
            os.replace(self.staging, self.final)
            shutil.rmtree(old, ignore_errors=True)


def recover(final: Path) -> list[str]:
    """Undo what killed builds left beside `final`: put back a build set aside by a replace that never
    finished, remove staging dirs whose process is gone. Returns what was done, a line each."""
    done = []
    side = [
        (m["kind"], int(m["pid"]), p)
        for p in final.parent.iterdir()
        if (m := _SIDE_DIR.match(p.name)) and m["name"] == final.name and p.is_dir() and not p.is_symlink()
    ]
    for kind, pid, path in sorted(side, key=lambda s: s[0] == "partial"):  # restore before deleting
        if _alive(pid):
            continue
        if kind == "old" and not final.exists() and is_build_dir(path):
            os.replace(path, final)
            done.append(f"put back the previous build {final}, set aside by a build that was killed while replacing it")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path.name}, left by a build that was killed (process {pid} is gone)")
    return done


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step; False where the OS or filesystem cannot (then nothing moved)."""
    renameat2 = getattr(_libc(), "renameat2", None) if sys.platform.startswith("linux") else None
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # an old kernel, or a filesystem without it
        return False
    raise OSError(err, os.strerror(err), str(b))


@functools.cache
def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours, from an earlier build in this process that died
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _disk_full(staging: Path) -> bool:
    free = free_bytes(staging)
    return free is not None and free < _DISK_FULL_BYTES


def is_build_dir(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file()

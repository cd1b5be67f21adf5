"""The user's own code, run where the project names it: `file.py:callable` (relative to the project) or
`package.module:callable`, imported with the project's folder importable for the call only. What it raises
is the user's to fix (`errors.user_code`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from tapeout.core.errors import BadInput, UserCodeError, user_code


@contextlib.contextmanager
def _importable_from(root: Path) -> Iterator[None]:
    # A project's helper modules sit next to its tapeout.toml; make them importable for the call only.
    root_str = str(root)
    added = root_str not in sys.path
    if added:
        sys.path.insert(0, root_str)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(root_str)


def resolve_callable(ref: str, root: Path, field_name: str) -> Callable:
    """`path/to/file.py:name` (relative to the project) or `package.module:name`."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise BadInput(
            f"{field_name} = {ref!r} is not a callable reference",
            fix="write 'file.py:function' or 'package.module:function'",
        )
    with _importable_from(root):
        if target.endswith(".py"):
            file = (root / target).resolve()
            if not file.is_file():
                raise BadInput(f"{field_name}: file {file} not found", fix="check the path, relative to tapeout.toml")
            name = f"tapeout_project_{hashlib.sha1(str(file).encode()).hexdigest()[:10]}_{file.stem}"
            stamp = (file.stat().st_mtime_ns, file.stat().st_size)
            module = sys.modules.get(name)
            # imported once per version of the file: a build resolves the same metric or data callable many times
            if module is None or getattr(module, "__tapeout_stamp__", None) != stamp:
                spec = importlib.util.spec_from_file_location(name, file)
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    with user_code(f"{field_name} {target} (importing it)", root):
                        spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(name, None)  # a half-run module is not the file: import it again next time
                    raise
                module.__tapeout_stamp__ = stamp
        else:
            try:
                with user_code(f"{field_name} {target} (importing it)", root):
                    module = importlib.import_module(target)
            except UserCodeError as exc:
                if not isinstance(exc.__cause__, ModuleNotFoundError) or exc.__cause__.name != target.split(".")[0]:
                    raise
                raise BadInput(
                    f"{field_name}: cannot import module '{target}' ({exc.__cause__})",
                    fix="install it, or use 'file.py:function' for a file next to tapeout.toml",
                ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise BadInput(f"{field_name}: '{attr}' is not a callable in {target}", fix=f"define {attr}() in {target}")
    return fn

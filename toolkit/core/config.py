"""Loading the files a user writes: the project file, build profiles (with `extends`), device specs.

Checking a profile against what this tapeout has (its target, options and precision) is `steps.setup`'s:
the registries sit above the core.

Every failure becomes one BadInput line naming the file, the field, what was found and what is allowed.
"""

from __future__ import annotations

import difflib
import importlib.resources
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from tapeout.core.errors import BadInput, one_line
from tapeout.core.schemas import DeviceSpec, Project, WorkloadSettingsError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


PROJECT_FILE = "tapeout.toml"


MAX_TOML_BYTES = 1 << 20  # a project file or profile is a page of text; a megabyte is not a mistake we can help


MAX_EXTENDS = 16  # profiles extend one another a few levels deep, never sixteen


def read_toml(path: Path, what: str) -> dict[str, Any]:
    if not _is_file(path):
        raise BadInput(f"{what} {path} not found", fix="check the path, or run from the directory that holds it")
    if path.stat().st_size > MAX_TOML_BYTES:
        raise BadInput(f"{path}: {path.stat().st_size:,} bytes is not a {what}", fix="check the path")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not valid TOML ({exc})", fix="fix the syntax at the position given") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise BadInput(
            f"{path}: arrays or tables nested too deeply to parse",
            fix="nothing in a tapeout file nests more than a few levels",
        ) from None


def describe_validation_error(path: Path, model: type[BaseModel], exc: ValidationError, prefix: str = "") -> str:
    """The first error as one line: file, dotted field, the problem, the allowed values where known. An unknown
    field goes first: a misspelt key is also a required one missing, and the misspelling is what to fix."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    inner = (err.get("ctx") or {}).get("error")
    if isinstance(inner, WorkloadSettingsError):  # [workload] refused by its kind's own schema: its fields named
        where = prefix + "".join(f"{part}." for part in err["loc"])
        return describe_validation_error(path, inner.schema, inner.error, where)
    loc = one_line(prefix + ".".join(str(part) for part in err["loc"])) or "(top level)"
    if err["type"] == "extra_forbidden":
        allowed = _fields_at(model, err["loc"][:-1])
        close = difflib.get_close_matches(str(err["loc"][-1]), allowed, n=1, cutoff=0.6)
        guess = f": did you mean '{close[0]}'?" if close else ""
        hint = f"; allowed here: {', '.join(allowed)}" if allowed else ""
        return f"{path}: unknown field '{loc}'{guess}{hint}"
    if err["type"] == "missing":
        return f"{path}: missing required field '{loc}'"
    found = err.get("input")
    found_text = "" if isinstance(found, dict | list) or found is None else f" (found {found!r})"
    msg = err["msg"].removeprefix("Value error, ")  # our validators' messages are whole sentences already
    if not err["loc"]:
        return f"{path}: {msg}"
    return f"{path}: field '{loc}': {msg}{found_text}"


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = _model_in(field.annotation)
        if current is None:
            return []
    return sorted(getattr(current, "model_fields", {}))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def validate(model: type[BaseModel], data: dict[str, Any], path: Path, prefix: str = ""):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadInput(describe_validation_error(path, model, exc, prefix)) from None


def load_project(path: Path | str) -> Project:
    """Load `tapeout.toml` from a project directory, or a project file given directly."""
    path = Path(path)
    try:
        file = path / PROJECT_FILE if path.is_dir() else path
    except (OSError, ValueError):  # a name too long for the filesystem
        file = path
    if not _is_file(file):
        raise BadInput(
            f"no project file at {file}", fix=f"give a directory that holds {PROJECT_FILE}, or the file itself"
        )
    project = validate(Project, read_toml(file, "project file"), file)
    project._root = file.parent.resolve()
    project._file = file.resolve()
    return project


def shipped_profiles_dir():
    return importlib.resources.files("tapeout.profiles")


def list_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in shipped_profiles_dir().iterdir() if p.name.endswith(".toml"))


def _is_file(path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the filesystem, or with a NUL in it
        return False


def find_profile(name: str, relative_to: Path | None = None) -> Path:
    """A profile is a path to a .toml file, or the name of a shipped profile."""
    if name.endswith(".toml") or "/" in name:
        candidate = Path(name)
        if relative_to is not None and not candidate.is_absolute():
            candidate = relative_to / candidate
        if _is_file(candidate):
            return candidate
        raise BadInput(
            f"profile file {candidate} not found",
            fix="check the path, or name a shipped profile (`tapeout profiles list`)",
        )
    shipped = shipped_profiles_dir() / f"{name}.toml"
    if _is_file(shipped):
        return Path(str(shipped))
    if relative_to is not None and _is_file(relative_to / f"{name}.toml"):
        return relative_to / f"{name}.toml"
    close = difflib.get_close_matches(name, list_profiles(), n=1, cutoff=0.6)
    raise BadInput(
        f"unknown profile '{name}'" + (f": did you mean '{close[0]}'?" if close else ""),
        fix=f"use one of: {', '.join(list_profiles())}, or a path to a .toml file",
    )


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def resolve_extends(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if len(seen) >= MAX_EXTENDS:
        raise BadInput(
            f"profile {seen[0]}: 'extends' chain is over {MAX_EXTENDS} profiles long",
            fix="extend a shipped profile directly; chains this long are a mistake",
        )
    if path in seen:
        chain = " → ".join(p.name for p in (*seen, path))
        raise BadInput(f"profile {path}: 'extends' forms a cycle ({chain})", fix="remove one of the 'extends' lines")
    data = read_toml(path, "profile")
    parent_name = data.pop("extends", None)
    if parent_name is None:
        return data
    if not isinstance(parent_name, str):
        raise BadInput(f"{path}: field 'extends' must be a profile name or path, found {parent_name!r}")
    parent = resolve_extends(find_profile(parent_name, relative_to=path.parent), (*seen, path))
    parent.pop("name", None)
    parent.pop("description", None)
    return _merge(_without_overridden_scoped_budgets(parent, data), data)


def budgets_set_by_the_user(path: Path) -> frozenset[str]:
    """The budgets a profile file of the user's own sets, in its [budgets] or a [budgets.<kind>] table, itself or
    through a profile of theirs it extends: the project file's [budgets] gives way to these only, not to a shipped
    profile's defaults."""
    names: set[str] = set()
    shipped = Path(str(shipped_profiles_dir())).resolve()
    seen: set[Path] = set()
    while path is not None and path.resolve() not in seen and len(seen) < MAX_EXTENDS:
        path = path.resolve()
        seen.add(path)
        data = read_toml(path, "profile")
        if path.parent != shipped and isinstance(data.get("budgets"), dict):
            for key, value in data["budgets"].items():
                names.update(value if isinstance(value, dict) else [key])
        parent = data.get("extends")
        path = find_profile(parent, relative_to=path.parent) if isinstance(parent, str) else None
    return frozenset(names)


def _without_overridden_scoped_budgets(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """The child decides a budget where it sets it. One in its [budgets] is its value for every workload: the
    parent's [budgets.<kind>] tables, which sit over [budgets], lose that key. One in any of its [budgets.<kind>]
    tables is decided kind by kind: the parent's [budgets] loses it, so a kind whose table leaves it out has none
    (cpu-int8 judges a forward build's metric in its units, a language model's perplexity relative to FP32)."""
    mine, theirs = child.get("budgets"), parent.get("budgets")
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return parent
    shared = {k for k, v in mine.items() if not isinstance(v, dict)}
    by_kind = {b for v in mine.values() if isinstance(v, dict) for b in v}
    budgets = {
        k: {b: v for b, v in table.items() if b not in shared} if isinstance(table, dict) else table
        for k, table in theirs.items()
        if isinstance(table, dict) or k not in by_kind
    }
    return {**parent, "budgets": budgets}


def list_devices() -> list[str]:
    folder = importlib.resources.files("tapeout.profiles.devices")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def device_matching(reported: str | None) -> DeviceSpec | None:
    """The shipped device spec whose identifiers match the name a device's driver reported (the longest
    identifier wins: "H100 PCIe" over a bare "H100"), or None."""
    best, length = None, 0
    for name in list_devices() if reported else ():
        spec = load_device(name)
        hits = [len(i) for i in spec.identifiers if i.lower() in reported.lower()]
        if hits and max(hits) > length:
            best, length = spec, max(hits)
    return best


def load_device(name: str, origin: Path | None = None) -> DeviceSpec:
    file = importlib.resources.files("tapeout.profiles.devices") / f"{name}.toml"
    if not file.is_file():
        where = f"{origin}: field 'device': " if origin else ""
        raise BadInput(f"{where}unknown device spec '{name}'", fix=f"use one of: {', '.join(list_devices())}")
    path = Path(str(file))
    return validate(DeviceSpec, read_toml(path, "device spec"), path)

"""The farm's plan file: which projects to build for which profiles, and the device each profile's check needs.

    [farm]                       # all optional
    out = "farm"                 # relative to the plan file
    retries = 1                  # tries on another node holding the device after a worker is lost
    builds_per_node = 1          # host-side builds one node runs at once (a check always has its node to itself)
    check = true                 # check every build on its device (false: build only)

    [[build]]
    project = "samples/digits-cnn"
    profiles = ["cpu-fp32", "cpu-int8"]

    [devices]                    # per profile name: the device its check needs
    qnn-sm8650 = "snapdragon-8-gen3"

A profile's device defaults to its device spec (`device = ...` in the profile), or `host-cpu` where it names none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from tapeout.core.config import find_profile, load_project, read_toml, resolve_extends, validate
from tapeout.core.errors import BadInput
from tapeout.core.schemas import Project, _Strict, folder_safe

HOST_CPU = "host-cpu"
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def device_name(value: str, what: str) -> str:
    """A device name as a plan or a worker gives it ("device:" prefix optional): letters, digits, '.', '_', '-'."""
    name = value.removeprefix("device:")
    if not _DEVICE_NAME.match(name):
        raise ValueError(
            f"{what} {value!r} must be a device name (letters, digits, '.', '_', '-'; e.g. host-cpu, h100-sxm)"
        )
    return name


class FarmSettings(_Strict):
    out: str = "farm"
    retries: int = Field(1, ge=0, le=5)
    builds_per_node: int = Field(1, ge=1, le=16)
    check: bool = True


class BuildEntry(_Strict):
    project: str = Field(min_length=1)
    profiles: list[str] = Field(min_length=1, max_length=64)

    @field_validator("profiles")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a profile is named twice")
        return value


class PlanFile(_Strict):
    farm: FarmSettings = FarmSettings()
    build: list[BuildEntry] = Field(min_length=1, max_length=256)
    devices: dict[str, str] = Field(default_factory=dict)

    @field_validator("devices")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        return {profile: device_name(device, f"device of profile {profile!r}") for profile, device in value.items()}


@dataclass(frozen=True)
class Job:
    """One project built for one profile, checked on one device."""

    project: Project
    profile: str  # the profile's resolved name (a build dir's folder name)
    profile_data: dict[str, Any]  # the profile with `extends` merged
    profile_toml: str  # the same as TOML: what a worker builds with
    device: str

    @property
    def name(self) -> str:
        return f"{self.project.display_name}/{self.profile}"


@dataclass(frozen=True)
class Plan:
    path: Path
    settings: FarmSettings
    jobs: list[Job]
    out: Path  # the farm's out dir: one build dir per project and profile, farm.json, farm.html


def load_plan(path: Path, out: Path | None = None) -> Plan:
    """Read and validate the plan, every project and every profile in it, before anything runs: a typo is one
    line and exit 2, not a failed task on a worker."""
    from tapeout.steps.setup import load_profile

    if path.is_dir():
        raise BadInput(f"{path} is a directory, not a plan file", fix="give the farm's PLAN.toml")
    plan = validate(PlanFile, read_toml(path, "farm plan"), path)
    base = path.parent
    jobs: list[Job] = []
    names: dict[str, Path] = {}
    used_profiles: set[str] = set()
    for entry in plan.build:
        project = load_project(base / entry.project)
        name = project.display_name
        try:  # its build dirs are folders of the farm's out dir: a name, never a path
            folder_safe(name, "the project's name (its [model] name, else its folder's)")
        except ValueError as exc:
            raise BadInput(f"{project.file}: {exc}", fix='set [model] name = "a-plain-name"') from None
        if names.setdefault(name, project.root) != project.root:
            raise BadInput(
                f"{path}: two projects are both named {name!r} ({names[name]} and {project.root}): their "
                "build dirs would be one folder",
                fix="give one a different [model] name",
            )
        for given in entry.profiles:
            profile_path = find_profile(given, relative_to=base)
            profile = load_profile(str(profile_path))  # validated as `tapeout build` validates it
            data = resolve_extends(profile_path)
            data["name"] = profile.name
            used_profiles.add(profile.name)
            if any(j.project.root == project.root and j.profile == profile.name for j in jobs):
                raise BadInput(
                    f"{path}: {name} is built for profile {profile.name} twice",
                    fix="name each profile once per project",
                )
            device = plan.devices.get(profile.name) or plan.devices.get(given) or profile.device
            if device is None and not _runs_on_host_cpu(profile.target):
                raise BadInput(
                    f"{path}: profile {profile.name} names no device spec, and its target "
                    f"({profile.target}) does not run on a host CPU",
                    fix=f'say which device its check needs: [devices] {profile.name} = "h100-sxm" (a device spec name)',
                )
            jobs.append(Job(project, profile.name, data, profile_toml(data), device or HOST_CPU))
    unknown = sorted(set(plan.devices) - used_profiles - {p for e in plan.build for p in e.profiles})
    if unknown:
        raise BadInput(
            f"{path}: [devices] names profile {unknown[0]!r}, which no [[build]] entry builds",
            fix="remove it, or add the profile to a [[build]] entry",
        )
    where = (out if out is not None else path.parent / plan.farm.out).resolve()
    for job in jobs:
        if where == job.project.root or job.project.root.is_relative_to(where):
            raise BadInput(
                f"the farm's out dir {where} holds project {job.project.root}",
                fix="choose an out dir outside every project (--out, or [farm] out)",
            )
    return Plan(path.resolve(), plan.farm, jobs, where)


def profile_toml(data: dict[str, Any]) -> str:
    """A resolved profile as TOML (a worker reads it as `tapeout build` reads any profile), checked to read back as
    the same data."""
    import json

    from tapeout.core.config import tomllib

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float | str):
            return json.dumps(v)  # JSON's numbers and quoted strings are TOML's too (NaN and inf never pass the schema)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise BadInput(f"profile value {v!r} cannot be sent to a worker", fix="use TOML's plain types")

    text = "".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in data.items())
    if tomllib.loads(text) != data:
        raise BadInput(
            f"profile {data.get('name')} does not read back the same once written as TOML for a worker",
            fix="report this, with the profile",
        )
    return text


def _runs_on_host_cpu(target: str) -> bool:
    """A target whose check times on the host's CPU (not a GPU's clock, not a device-built engine)."""
    from tapeout import targets

    caps = targets.TARGETS[target].capabilities
    return caps.timing_sync == "none" and caps.compile_on == "host" and not caps.device_memory

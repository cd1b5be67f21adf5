"""What a build or a check carries through its steps, resolved once: the project (builds only), the
profile, the target with its validated options, the device spec, whether this host's timings are
emulated, and where the output goes. Steps take the context instead of long parameter lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tapeout import targets
from tapeout.config import load_device, load_profile, load_project
from tapeout.console import UI
from tapeout.targets.base import Probe, Target
from tapeout.types import DeviceSpec, Profile, Project


@dataclass
class Context:
    profile: Profile
    target: Target
    probe: Probe                         # taken once: for a GPU target it creates a CUDA session
    ui: UI
    project: Project | None = None       # None on the device: `check` has the build dir, not the project
    device: DeviceSpec | None = None     # the profile's device spec, if it names one
    stage: Path | None = None            # the staging dir of a build in progress
    emulated: str | None = field(init=False)

    def __post_init__(self) -> None:
        self.emulated = self.target.emulated()

    @property
    def capabilities(self):
        return self.target.capabilities


def for_build(project_dir: Path | str, profile_name: str, ui: UI) -> Context:
    """Load and validate everything a build needs, and stop early (exit 4) if the target cannot run here."""
    project = load_project(project_dir)
    profile = load_profile(profile_name)
    target = targets.create(profile.target, profile.options)
    probe = target.probe()
    probe.require(profile.target)
    target.preflight()
    device = load_device(profile.device) if profile.device else None
    return Context(profile, target, probe, ui, project=project, device=device)

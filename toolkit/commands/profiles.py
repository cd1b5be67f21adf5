"""`tapeout profiles list` and `tapeout profiles show`: the shipped profiles and device specs, one as resolved."""

from __future__ import annotations

from tapeout.commands.output import print_json
from tapeout.core.config import list_devices, list_profiles, load_device
from tapeout.steps.setup import load_profile


def listing(as_json: bool) -> int:
    names = list_profiles()
    if as_json:
        print_json({"profiles": names, "devices": list_devices()})
        return 0
    profiles = [(name, load_profile(name)) for name in names]
    wide_name = max(len(name) for name in names)
    wide_target = max(len(p.target) for _, p in profiles)
    for name, p in profiles:
        print(f"{name:<{wide_name}}  {p.target:<{wide_target}}  {p.description}")
    print(f"device specs: {', '.join(list_devices())}")
    return 0


def show(name: str) -> int:
    if name in list_devices() and name not in list_profiles():
        print_json({"device_spec": load_device(name).model_dump(mode="json")})
        return 0
    profile = load_profile(name)
    spec = load_device(profile.device).model_dump(mode="json") if profile.device else None
    print_json({**profile.model_dump(mode="json"), "device_spec": spec})
    return 0

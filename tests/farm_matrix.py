"""The farm's toy matrix, shared by tests/test_farm.py and bench/farm.py: three two-layer MLP projects of three
widths, and lean profiles (20 timed runs in one process, no op profile) over shipped ones."""

from __future__ import annotations

from pathlib import Path

MODEL = """import torch

def build():
    torch.manual_seed({seed})
    return torch.nn.Sequential(torch.nn.Linear(16, {width}), torch.nn.ReLU(), torch.nn.Linear({width}, 4))
"""
PROJECT = '[model]\nname = "{name}"\nsource = "model.py:build"\n\n[[inputs]]\nname = "x"\nshape = [1, 16]\n'
LEAN = 'extends = "{base}"\n[check]\niterations = 20\nrepeats = 1\nwarmup_min_s = 0.02\nop_profile = false\n'


def toy_projects(root: Path) -> list[Path]:
    """toy-a, toy-b and toy-c under `root`."""
    found = []
    for i, (name, width) in enumerate((("toy-a", 32), ("toy-b", 48), ("toy-c", 24))):
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(MODEL.format(seed=i, width=width))
        (folder / "tapeout.toml").write_text(PROJECT.format(name=name))
        found.append(folder)
    return found


def lean_profiles(root: Path, bases: dict[str, str]) -> list[Path]:
    """`root/NAME.toml` for each NAME → shipped profile it extends."""
    paths = []
    for name, base in bases.items():
        (root / f"{name}.toml").write_text(LEAN.format(base=base))
        paths.append(root / f"{name}.toml")
    return paths

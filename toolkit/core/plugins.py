"""Plug-ins: targets, quantization methods and graph passes from other installed packages, found through
Python entry points (groups `tapeout.targets`, `tapeout.quantization_methods`, `tapeout.graph_passes`,
`tapeout.workloads`). Each
entry names one object (a target's registry entry, a method class, a pass class) as `module:attribute`; a
package declares them in its own metadata, so adding one edits nothing of tapeout. Entry points are looked
up only when a name is not built in, or when a registry is listed.
"""

from __future__ import annotations

import functools
from importlib import metadata

from tapeout.core.errors import BadInput, first_line

GROUPS = ("tapeout.targets", "tapeout.quantization_methods", "tapeout.graph_passes", "tapeout.workloads")


@functools.cache
def entries(group: str) -> dict[str, metadata.EntryPoint]:
    """The entry points of `group` installed here, by name."""
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def load(group: str, name: str) -> object:
    """The object plug-in `name` of `group` names; one line when it cannot be imported."""
    entry = entries(group)[name]
    try:
        return entry.load()
    except Exception as exc:  # whatever the plug-in's own import raises
        owner = f" (from {entry.dist.name} {entry.dist.version})" if entry.dist else ""
        raise BadInput(
            f"the {group.rpartition('.')[2].replace('_', ' ')} plug-in '{name}' = {entry.value}{owner} could "
            f"not be loaded: {type(exc).__name__}: {first_line(exc)}",
            fix="reinstall that package, or uninstall it",
        ) from None

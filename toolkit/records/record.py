"""The base of every record tapeout writes: frozen, and unknown fields refused, so a file from elsewhere
with a field tapeout does not write is not read as one it does. `Json` is the type of content defined by a plug-in rather than by
tapeout (a target's notes on its artifact, a meter's raw readings, an engine inspector's layers): any
JSON value, never an arbitrary object.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, JsonValue

Json = JsonValue


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

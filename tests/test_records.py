"""The files tapeout writes are typed records: no section of a report is an untyped dict, and what a build
writes reads back as the same record."""

from __future__ import annotations

import dataclasses
import json
import typing

from pydantic import BaseModel

from tapeout.records.report import Report


def _loose(annotation, where: str, seen: set) -> list[str]:
    """The places under `annotation` typed Any (a dict[str, Any], a list[Any], a bare Any)."""
    if annotation is typing.Any:
        return [where]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation in seen:
            return []
        seen.add(annotation)
        return [
            hit
            for name, field in annotation.model_fields.items()
            for hit in _loose(field.annotation, f"{where}.{name}", seen)
        ]
    if typing.get_origin(annotation) is typing.Annotated:  # the type, not its validation metadata
        return _loose(typing.get_args(annotation)[0], where, seen)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        hints = typing.get_type_hints(annotation)
        return [hit for f in dataclasses.fields(annotation) for hit in _loose(hints[f.name], f"{where}.{f.name}", seen)]
    value = getattr(annotation, "__value__", None)  # a type alias (pydantic's JsonValue): what it stands for
    if value is not None and annotation not in seen:
        seen.add(annotation)
        return _loose(value, where, seen)
    return [
        hit
        for arg in typing.get_args(annotation)
        if not isinstance(arg, str | typing.ForwardRef)
        for hit in _loose(arg, f"{where}[]", seen)
    ]


def test_no_report_field_is_untyped():
    assert _loose(Report, "Report", set()) == []


def test_the_check_finds_a_loose_field():
    class Loose(BaseModel):
        fine: dict[str, int]
        notes: dict[str, typing.Any]

    assert _loose(Loose, "Loose", set()) == ["Loose.notes[]"]


def test_a_report_reads_back_as_what_was_written(digits_build):
    data = json.loads((digits_build / "report.json").read_text())
    assert Report.model_validate(data).to_json() == data

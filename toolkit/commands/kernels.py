"""`tapeout kernels list|verify|bench`: the fused Triton kernels, proved correct here or on the GPU, timed on the
GPU beside eager PyTorch and Inductor."""

from __future__ import annotations

import sys

from tapeout.commands.output import print_json
from tapeout.core.errors import EXIT_BUDGET_FAILED, BadInput

DTYPES = ("float32", "float16", "bfloat16")


def _available() -> None:
    """Exit 4 with the install line where torch or triton cannot be imported, before either is touched."""
    from tapeout.core.errors import TargetUnavailable
    from tapeout.targets import kernels as registry

    why = registry.probe()
    if why:
        raise TargetUnavailable(f"the kernels need Triton and torch: {why}", fix=registry.INSTALL)


def _chosen(names: list[str] | None) -> list:
    from tapeout.targets import kernels as registry

    return [registry.get(name) for name in (names or registry.names())]


def _dtypes(value: str | None) -> tuple[str, ...] | None:
    if not value:
        return None
    found = tuple(v.strip() for v in value.split(",") if v.strip())
    wrong = [v for v in found if v not in DTYPES]
    if wrong:
        raise BadInput(f"unknown dtype {wrong[0]!r} for --dtype", fix=f"use {', '.join(DTYPES)} (comma-separated)")
    return found


def listing(as_json: bool) -> int:
    from tapeout.targets import kernels as registry

    why = registry.probe()
    rows = []
    for name in registry.names():
        info = {"kernel": name, "summary": "", "replaces": "", "dtypes": []}
        if why is None:
            kernel = registry.get(name)
            info.update(summary=kernel.summary, replaces=kernel.replaces, dtypes=list(kernel.dtypes))
        rows.append(info)
    if as_json:
        print_json({"available": why is None, "reason": why, "kernels": rows})
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if why:
        print(f"tapeout kernels: not available here: {why} — {registry.INSTALL}", file=sys.stderr)
    table = Table("kernel", "what", "replaces", "dtypes", show_lines=True)
    for r in rows:
        table.add_row(r["kernel"], escape(r["summary"]), escape(r["replaces"]), ", ".join(r["dtypes"]))
    Console(width=None if Console().is_terminal else 160).print(table)
    return 0


def verify(names: list[str] | None, dtype: str | None, all_configs: bool, as_json: bool) -> int:
    from tapeout.measurement import kernel_harness as harness

    dtypes = _dtypes(dtype)
    _available()
    where = harness.backend()  # before triton is imported: it reads TRITON_INTERPRET once
    chosen = _chosen(names)
    how = "on the GPU" if where == "cuda" else "in Triton's interpreter (no GPU here: cases cut to a quick size)"
    print(f"verifying {len(chosen)} kernel(s) {how}", file=sys.stderr)
    checks = []
    for kernel in chosen:
        found = harness.verify(kernel, where, dtypes, all_configs)
        bad = sum(c.ok is False for c in found)
        print(
            f"  {kernel.name}: {sum(c.ok is True for c in found)} passed, {bad} failed, "
            f"{sum(c.ok is None for c in found)} not verifiable here",
            file=sys.stderr,
        )
        checks += found
    failed = [c for c in checks if c.ok is False]
    if as_json:
        print_json({"backend": where, "checks": [c.row() for c in checks], "failed": len(failed)})
    else:
        _verify_table(checks)
    return EXIT_BUDGET_FAILED if failed else 0


def _verify_table(checks: list) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table("kernel", "case", "dtype", "config", "verdict", "worst / tol", "max |err|", "note")
    for c in checks:
        verdict = "[green]pass[/]" if c.ok else "[red]FAIL[/]" if c.ok is False else "[yellow]not here[/]"
        note = c.problem or (f"{c.label}; cut from {c.cut_from}" if c.cut_from else c.label)
        table.add_row(c.kernel, c.case, c.dtype, c.config, verdict, f"{c.worst:.3g}", f"{c.max_abs:.3g}", escape(note))
    Console(width=None if Console().is_terminal else 200).print(table)


def bench(
    names: list[str] | None, dtype: str | None, calls: int, max_autotune: bool, retune: bool, as_json: bool
) -> int:
    from tapeout.core.config import device_matching
    from tapeout.measurement import kernel_harness as harness

    if calls < 10:
        raise BadInput(f"--calls {calls} is too few to give a p90", fix="use --calls 10 or more (default 100)")
    dtypes = _dtypes(dtype) or ("float16",)
    _available()
    where = harness.gpu()  # exit 4 here without a GPU, before anything else
    spec = device_matching(where["name"])
    print(
        f"timing on {where['name']} ({where['key']}); roof from "
        f"{spec.name if spec else 'no device spec (none names this GPU): no roof fraction'}",
        file=sys.stderr,
    )
    rows = []
    for kernel in _chosen(names):
        for d in dtypes:
            if d in kernel.dtypes:
                print(f"  {kernel.name} {d} …", file=sys.stderr)
                rows += harness.bench(kernel, d, calls, max_autotune=max_autotune, spec=spec, retune=retune)
    if as_json:
        print_json({"device": where["key"], "spec": spec.name if spec else None, "rows": [r.row() for r in rows]})
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        "kernel",
        "case",
        "dtype",
        "kernel p50 (p90) ms",
        "eager ms",
        "Inductor ms",
        "max-autotune ms",
        "vs best other",
        "GB/s",
        "roof",
        "host launch µs",
        "config",
    )
    for r in rows:
        others = [t for t in (r.eager_ms, r.inductor_ms, r.max_autotune_ms) if t]
        table.add_row(
            r.kernel,
            escape(f"{r.case} ({r.label})"),
            r.dtype,
            f"{r.kernel_ms:.4f} ({r.kernel_p90_ms:.4f})",
            _ms(r.eager_ms),
            _ms(r.inductor_ms),
            _ms(r.max_autotune_ms),
            f"{min(others) / r.kernel_ms:.2f}×" if others else "—",
            f"{r.achieved_gbs:.0f}",
            f"{r.roof_fraction:.0%}" if r.roof_fraction else "—",
            f"{r.launch_us:.0f}",
            r.config,
        )
    Console(width=None if Console().is_terminal else 220).print(table)
    return 0


def _ms(value: float | None) -> str:
    return f"{value:.4f}" if value else "—"

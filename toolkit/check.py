"""`tapeout check BUILD_DIR`: on the device, prove the artifact still meets its budgets.

Needs the target's runtime and numpy; never torch or transformers. Verifies the artifact against
the manifest's hashes, runs golden parity, latency, cold start and memory in fresh processes, and
writes `check.json` (same schema as report.json, kind "check").
"""

from __future__ import annotations

import json
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from pydantic import ValidationError

from tapeout import builddir, manifest, targets, verdicts
from tapeout import measure as measuring
from tapeout.console import UI
from tapeout.data import load_golden
from tapeout.errors import BadInput
from tapeout.parity import compare
from tapeout.report import SCHEMA, render_markdown
from tapeout.types import Artifact, BudgetResult, Budgets, CheckSettings, Profile, Verdict


def read_manifest(build_dir: Path) -> dict:
    if not build_dir.is_dir():
        raise BadInput(f"build dir {build_dir} not found", fix="give the directory `tapeout build` wrote")
    path = build_dir / builddir.MANIFEST
    if not path.is_file():
        raise BadInput(f"{build_dir} is not a tapeout build dir (no {builddir.MANIFEST}); an interrupted build leaves none",
                       fix="run `tapeout build` again and check the directory it prints")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path} is not valid JSON ({exc})", fix="rebuild; a manifest is never edited by hand") from None
    if data.get("schema") != manifest.SCHEMA:
        raise BadInput(f"{path}: schema {data.get('schema')!r} is not {manifest.SCHEMA!r}",
                       fix="check it with the tapeout version that built it, or rebuild")
    return data


def verify_artifact(build_dir: Path, man: dict) -> None:
    artifact_dir = build_dir / "artifact"
    for rel, expected in man["artifact"]["files"].items():
        file = artifact_dir / rel
        if not file.is_file():
            raise BadInput(f"artifact file {file} is missing", fix="copy the whole build dir to the device, or rebuild")
        if manifest.sha256_file(file) != expected:
            raise BadInput(f"artifact file {file} differs from the one the build recorded (sha256 mismatch)",
                           fix="restore the build dir as built, or rebuild")


def _profile(man: dict, build_dir: Path) -> Profile:
    try:
        return Profile.model_validate(man["profile"])
    except (ValidationError, KeyError) as exc:
        raise BadInput(f"{build_dir / builddir.MANIFEST}: the recorded profile does not validate ({exc})",
                       fix="rebuild with this tapeout version") from None


def measure_target(backend, artifact: Artifact, options, golden_path: Path, settings: CheckSettings,
                   budgets: Budgets, ui: UI, emulated: str | None) -> tuple[measuring.Measurement, CheckSettings]:
    """Fresh-process measurement, shared by build and check. Through an emulator only enough runs for
    parity: its timings are never judged, so nothing is re-measured either."""
    if emulated:
        settings = measuring.for_emulator(settings)
    with ui.step(f"measure {artifact.target} in fresh inference processes" + (" (emulated: parity only)" if emulated else "")):
        m = measuring.measure(artifact, options.model_dump(), golden_path, settings, progress=ui.detail,
                              **({} if emulated else {"undecided": verdicts.latency_undecided(budgets, settings)}))
    if emulated:
        m.notes.append(f"{emulated}; {settings.iterations} runs for parity, not judged")
    return m, settings


def _accuracy_from_build(build_dir: Path, profile: Profile) -> list[BudgetResult]:
    declared = {"accuracy_max_drop": profile.budgets.accuracy_max_drop,
                "accuracy_max_rel_drop": profile.budgets.accuracy_max_rel_drop}
    report = build_dir / "report.json"
    built = {e["budget"]: e for e in json.loads(report.read_text()).get("budgets", [])} if report.is_file() else {}
    results = []
    for budget, limit in declared.items():
        if limit is None:
            continue
        if budget not in built:
            results.append(BudgetResult(budget, limit, "metric", Verdict.UNMEASURED,
                                        reason="no build report with the metric next to the artifact"))
            continue
        carried = BudgetResult.from_json(built[budget])
        results.append(BudgetResult(carried.budget, carried.limit, carried.unit, carried.verdict, carried.measured,
                                    carried.bound, f"judged at build on the host with this same artifact (hashes "
                                    f"verified); the metric's data stays on the host. {carried.reason}"))
    return results


def check(build_dir: Path | str, ui: UI, strict: bool = False, iterations: int | None = None,
          repeats: int | None = None) -> tuple[dict, int]:
    build_dir = Path(build_dir).resolve()
    man = read_manifest(build_dir)
    target = man["artifact"]["target"]
    if target not in targets.TARGETS:
        raise BadInput(f"{build_dir} was built for target '{target}', which this tapeout does not know",
                       fix=f"check it with a tapeout that has that backend, or rebuild for one of: {', '.join(targets.TARGETS)}")
    backend = targets.load(target)
    probe = backend.probe()
    probe.require(target)
    verify_artifact(build_dir, man)
    profile = _profile(man, build_dir)
    settings = profile.check
    if iterations or repeats:
        settings = settings.model_copy(update={k: v for k, v in {"iterations": iterations, "repeats": repeats}.items() if v})
    options = backend.Options(**profile.options)
    if hasattr(backend, "preflight"):
        backend.preflight(options)
    artifact = Artifact(target, build_dir / "artifact", man["artifact"]["main_file"])
    golden_path = build_dir / man["golden"]["file"]
    if manifest.sha256_file(golden_path) != man["golden"]["sha256"]:
        raise BadInput(f"{golden_path} differs from the one the build recorded", fix="restore the build dir as built")
    _, golden_outputs = load_golden(golden_path)

    emulated = targets.emulated(backend)
    m, settings = measure_target(backend, artifact, options, golden_path, settings, profile.budgets, ui, emulated)
    parity = compare(golden_outputs, m.outputs, settings.parity.atol, settings.parity.rtol)
    host, built_on = manifest.host_fingerprint(), man.get("host", {})
    if (host["cpu"], host["cpu_flags"]) != (built_on.get("cpu"), built_on.get("cpu_flags")):
        m.notes.append(f"checked on {host['cpu']} ({' '.join(host['cpu_flags'])}); built on {built_on.get('cpu')} "
                       f"({' '.join(built_on.get('cpu_flags', []))}): parity above is this CPU's")
    artifact_bytes = manifest.tree_size(artifact.directory)
    budgets = [
        *verdicts.judge_on_device(profile.budgets, m, settings, emulated),
        *verdicts.judge_artifact(profile.budgets, artifact_bytes),
        *verdicts.judge_placement(profile.budgets, man["artifact"].get("meta", {}).get("placement"),
                                  where=" (the build's compile-time op trace; the artifact is that compiled graph)"),
        verdicts.judge_parity(parity, settings.parity),
        *_accuracy_from_build(build_dir, profile),
    ]
    code = verdicts.exit_code(budgets, strict)
    report = {
        "schema": SCHEMA,
        "kind": "check",
        "created": manifest.now(),
        "project": {"name": man["project"]["name"], "source": man["project"]["source"], "file": man["project"]["file"]},
        "profile": {"name": profile.name, "target": target, "device": profile.device, "precision": profile.precision},
        "target": {"name": target, "version": probe.version, "emulated": emulated},
        "export": None,
        "artifact": {"main_file": artifact.main_file, "bytes": artifact_bytes,
                     "sha256": man["artifact"]["files"][artifact.main_file]},  # verified above, not hashed again
        "golden": {"samples": len(golden_outputs), "source": "golden.npz", "reference": "the build's reference outputs"},
        "parity": [p.to_json() for p in parity],
        "accuracy": None,
        "measurement": m.to_json(),
        "budgets": [b.to_json() for b in budgets],
        "lint": [],
        "host": host,
        "exit_code": code,
        "build_dir": str(build_dir),
    }
    builddir.write_json(build_dir / "check.json", report)
    builddir.write_text(build_dir / "check.md", render_markdown(report))
    return report, code


def junit_xml(report: dict) -> str:
    """One testcase per budget: fail and inconclusive are failures, unmeasured and estimated are skipped."""
    cases, failures, skipped = [], 0, 0
    for b in report["budgets"]:
        name = quoteattr(b["budget"])
        body = ""
        if b["verdict"] in ("fail", "inconclusive"):
            failures += 1
            body = f'<failure message={quoteattr(b["verdict"] + ": " + b["reason"])}>{escape(json.dumps(b))}</failure>'
        elif b["verdict"] != "pass":
            skipped += 1
            body = f'<skipped message={quoteattr(b["verdict"] + ": " + b["reason"])}/>'
        cases.append(f'    <testcase classname="tapeout.check" name={name}>{body}</testcase>')
    suite = quoteattr(f"tapeout check {report['project']['name']} ({report['profile']['name']})")
    return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            f"<testsuite name={suite} tests=\"{len(cases)}\" failures=\"{failures}\" skipped=\"{skipped}\">\n"
            + "\n".join(cases) + "\n</testsuite>\n")

"""Budgets judged against measurements: pass, fail, inconclusive, unmeasured (with the reason).

Latency is judged on confidence bounds of the percentile, not its point value: pass when the upper
bound is under the limit by the guard band, fail when the lower bound is over the limit, else
inconclusive. Exit codes follow DESIGN.md §4.
"""

from __future__ import annotations

from tapeout.core.errors import EXIT_BUDGET_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from tapeout.core.parity import OutputParity
from tapeout.core.profile_schema import CheckSettings, ParitySettings
from tapeout.core.schemas import Budgets
from tapeout.core.verdict import BudgetResult, Verdict
from tapeout.measurement.generation import GenerationMeasurement
from tapeout.measurement.measure import Measurement
from tapeout.measurement.streaming import StreamMeasurement
from tapeout.measurement.transcription import TranscriptionMeasurement


def judge_bounded(
    budget: str, limit: float, unit: str, point: float, lower: float, upper: float, guard: float, what: str
) -> BudgetResult:
    if upper <= limit * (1 - guard):
        verdict, reason = Verdict.PASS, f"upper bound {upper:.4g} {unit} ≤ limit less {guard:.0%} guard"
    elif lower > limit:
        verdict, reason = Verdict.FAIL, f"lower bound {lower:.4g} {unit} > limit"
    else:
        verdict = Verdict.INCONCLUSIVE
        reason = f"{what} interval [{lower:.4g}, {upper:.4g}] {unit} straddles the limit (or its guard band)"
    return BudgetResult(budget, limit, unit, verdict, point, (lower, upper), reason)


def judge_latency(budgets: Budgets, m: Measurement, settings: CheckSettings) -> list[BudgetResult]:
    results = []
    for q, limit in budgets.latency_quantiles().items():
        est = m.latency.quantiles[f"p{q * 100:g}"]
        results.append(
            judge_bounded(
                f"latency_p{q * 100:g}_ms",
                limit,
                "ms",
                est.point,
                est.lower,
                est.upper,
                settings.guard_band,
                f"{settings.confidence:.0%} order-statistic",
            )
        )
    if budgets.cold_start_ms is not None:
        cold = m.cold_start_ms
        results.append(
            judge_bounded(
                "cold_start_ms",
                budgets.cold_start_ms,
                "ms",
                sorted(cold)[len(cold) // 2],
                min(cold),
                max(cold),
                settings.guard_band,
                f"range over {len(cold)} fresh processes",
            )
        )
    return results


def judge_memory(budgets: Budgets, m: Measurement) -> list[BudgetResult]:
    if budgets.peak_memory_mb is None:
        return []
    peak = max(m.peak_rss_mb)
    verdict = Verdict.PASS if peak <= budgets.peak_memory_mb else Verdict.FAIL
    return [
        BudgetResult(
            "peak_memory_mb",
            budgets.peak_memory_mb,
            "MB",
            verdict,
            peak,
            None,
            f"worst peak RSS of {len(m.peak_rss_mb)} inference processes",
        )
    ]


def judge_artifact(budgets: Budgets, artifact_bytes: int) -> list[BudgetResult]:
    if budgets.artifact_mb is None:
        return []
    size = artifact_bytes / 2**20
    verdict = Verdict.PASS if size <= budgets.artifact_mb else Verdict.FAIL
    return [BudgetResult("artifact_mb", budgets.artifact_mb, "MB", verdict, size, None, "size of artifact/")]


def judge_gpu_memory(budgets: Budgets, m: Measurement) -> list[BudgetResult]:
    if budgets.gpu_memory_mb is None:
        return []
    if not m.device_memory_mb:
        return [
            BudgetResult(
                "gpu_memory_mb",
                budgets.gpu_memory_mb,
                "MB",
                Verdict.UNMEASURED,
                reason=m.unmeasured.get("device_memory", "no GPU meter read this process"),
            )
        ]
    peak = max(m.device_memory_mb)
    verdict = Verdict.PASS if peak <= budgets.gpu_memory_mb else Verdict.FAIL
    return [
        BudgetResult(
            "gpu_memory_mb",
            budgets.gpu_memory_mb,
            "MB",
            verdict,
            peak,
            None,
            f"worst of {len(m.device_memory_mb)} inference processes; {m.device_memory_scope}",
        )
    ]


def judge_power(budgets: Budgets, m: Measurement | None, guard: float = 0.0) -> list[BudgetResult]:
    """Energy per inference and average power over the timed window, on bounds that cover the spread
    between processes and the counter's granularity; unmeasured, with the reason, without a counter."""
    results = []
    energy = m.energy if m else None
    why = (m.unmeasured.get("energy") if m else None) or "not measured"
    for budget, limit, unit in (("energy_mj", budgets.energy_mj, "mJ"), ("power_avg_w", budgets.power_avg_w, "W")):
        if limit is None:
            continue
        if energy is None:
            results.append(BudgetResult(budget, limit, unit, Verdict.UNMEASURED, reason=why))
            continue
        if budget == "energy_mj":
            point, (lower, upper) = energy.j_per_inference * 1e3, (b * 1e3 for b in energy.bounds)
        else:
            point, (lower, upper) = energy.power_avg_w, energy.power_bounds
        result = judge_bounded(
            budget,
            limit,
            unit,
            point,
            lower,
            upper,
            guard,
            f"range over {len(energy.runs)} process(es) ± counter granularity",
        )
        results.append(
            BudgetResult(
                result.budget,
                limit,
                unit,
                result.verdict,
                point,
                result.bound,
                f"{result.reason}; {energy.scope}; {energy.method}",
            )
        )
    return results


def judge_parity(parity: list[OutputParity], settings: ParitySettings) -> BudgetResult:
    worst_cos = min(p.cosine for p in parity)
    bad = [p.output for p in parity if not p.within_tolerance or p.cosine < settings.min_cosine]
    max_abs = max(p.max_abs for p in parity)
    if bad:
        return BudgetResult(
            "parity_min_cosine",
            settings.min_cosine,
            "cosine",
            Verdict.FAIL,
            worst_cos,
            None,
            f"outputs off the golden reference: {', '.join(bad)} (max-abs {max_abs:.3g}, "
            f"atol {settings.atol:g}, rtol {settings.rtol:g})",
        )
    worst = min(parity, key=lambda p: p.cosine)
    return BudgetResult(
        "parity_min_cosine",
        settings.min_cosine,
        "cosine",
        Verdict.PASS,
        worst_cos,
        None,
        f"judged on the cosine: worst {worst.output} {worst_cos:.6g} against the golden outputs "
        f"(max-abs {max_abs:.3g}, inside atol {settings.atol:g} / rtol {settings.rtol:g})",
    )


def judge_accuracy(
    budgets: Budgets, reference: float | None, candidate: float | None, direction: str | None, metric: str
) -> list[BudgetResult]:
    results = []
    for budget, limit, relative in (
        ("accuracy_max_drop", budgets.accuracy_max_drop, False),
        ("accuracy_max_rel_drop", budgets.accuracy_max_rel_drop, True),
    ):
        if limit is None:
            continue
        unit = f"share of {metric}" if relative else metric
        if reference is None or candidate is None:
            results.append(
                BudgetResult(budget, limit, unit, Verdict.UNMEASURED, reason="the project has no [evaluation] metric")
            )
            continue
        drop = accuracy_drop(reference, candidate, direction, relative)
        verdict = Verdict.PASS if drop <= limit else Verdict.FAIL
        results.append(
            BudgetResult(
                budget,
                limit,
                unit,
                verdict,
                drop,
                None,
                f"{metric}: reference {reference:.6g}, artifact {candidate:.6g} ({direction} is better)",
            )
        )
    return results


def accuracy_drop(reference: float, candidate: float, direction: str | None, relative: bool = False) -> float:
    """How much worse the candidate is, in metric units or as a share of the reference (negative: better)."""
    drop = reference - candidate if direction == "higher" else candidate - reference
    return drop / abs(reference) if relative and reference else drop


def exit_code(results: list[BudgetResult], strict: bool = False) -> int:
    verdicts = {r.verdict for r in results}
    if Verdict.FAIL in verdicts:
        return EXIT_BUDGET_FAILED
    if Verdict.INCONCLUSIVE in verdicts:
        return EXIT_INCONCLUSIVE
    # DESIGN §4: unmeasured and estimated verdicts are printed, and only --strict makes them count.
    if strict and verdicts & {Verdict.UNMEASURED, Verdict.ESTIMATED_PASS, Verdict.ESTIMATED_FAIL}:
        return EXIT_BUDGET_FAILED
    return EXIT_OK


def latency_undecided(budgets: Budgets, settings: CheckSettings):
    """For measure(): does a measurement leave a latency budget inconclusive?"""

    def undecided(m: Measurement) -> bool:
        return any(
            r.verdict is Verdict.INCONCLUSIVE and r.budget.startswith("latency")
            for r in judge_latency(budgets, m, settings)
        )

    return undecided


def judge_on_device(
    budgets: Budgets,
    m: Measurement,
    settings: CheckSettings,
    emulated: str | None,
    estimated: list[BudgetResult] | None = None,
) -> list[BudgetResult]:
    """Latency, memory, GPU memory, energy and power; through an emulator they are measured but never
    judged (DESIGN §4). There, a budget decided on the estimate for the device (`estimated`: the
    estimated-pass / estimated-fail verdicts of `estimation.estimate.judge`) takes the place of its own."""
    results = [
        *judge_latency(budgets, m, settings),
        *judge_memory(budgets, m),
        *judge_gpu_memory(budgets, m),
        *judge_power(budgets, m, settings.guard_band),
    ]
    if emulated is None:
        return results
    decided = {r.budget: r for r in estimated or []}
    return [
        decided.get(r.budget)
        or BudgetResult(
            r.budget,
            r.limit,
            r.unit,
            Verdict.UNMEASURED,
            None,
            None,
            f"emulated: {emulated}"
            + (f" (the emulator measured {r.measured:.4g} {r.unit})" if r.measured is not None else "")
            + "; run `tapeout check` on the device",
        )
        for r in results
    ]


def judge_placement(budgets: Budgets, placement: dict | None, where: str = "") -> list[BudgetResult]:
    """Share of nodes off the intended accelerator, from the backend's own placement record."""
    limit = budgets.placement_max_off_share
    if limit is None:
        return []
    if not placement:
        return [
            BudgetResult(
                "placement_max_off_share",
                limit,
                "share of nodes",
                Verdict.UNMEASURED,
                reason="this target reports no per-node placement",
            )
        ]
    off = placement["off_share"]
    listed = "; ".join(f"{n['node']} ({n['op_type']}): {n['reason']}" for n in placement["off"][:5])
    more = f" and {len(placement['off']) - 5} more" if len(placement["off"]) > 5 else ""
    reason = (
        f"{placement['on_accelerator']}/{placement['total_nodes']} nodes on the {placement['accelerator']}"
        + (f"; off: {listed}{more}" if listed else "")
        + where
    )
    return [
        BudgetResult(
            "placement_max_off_share",
            limit,
            "share of nodes",
            Verdict.PASS if off <= limit else Verdict.FAIL,
            off,
            None,
            reason,
        )
    ]


def judge_generation(
    budgets: Budgets, g: GenerationMeasurement | None, settings: CheckSettings, emulated: str | None
) -> list[BudgetResult]:
    """The generate workload's budgets: TTFT at the longest prompt (p90), time per output token (p90, p99), decode
    tokens/s (from the median time per token's bounds), the KV cache at max_context, greedy agreement. For a forward
    workload they are unmeasured, with the reason; through an emulator the timings are not judged."""
    asked = budgets.generation_budgets()
    if not asked:
        return []
    if g is None:
        return not_run(asked, 'the project\'s [workload] is forward: set kind = "generate" to measure generation')
    guard, how = settings.guard_band, f"{settings.confidence:.0%} order-statistic"
    results = []
    timed = {"ttft_ms", "tpot_p90_ms", "tpot_p99_ms", "decode_tokens_per_s"}
    for name, limit in asked.items():
        if name in timed and emulated:
            results.append(
                BudgetResult(
                    name,
                    limit,
                    "ms" if name != "decode_tokens_per_s" else "tokens/s",
                    Verdict.UNMEASURED,
                    reason=f"emulated: {emulated}; run `tapeout check` on the device",
                )
            )
        elif name == "ttft_ms":
            longest = max(g.ttft)
            q = g.ttft[longest].quantiles["p90"]
            r = judge_bounded(name, limit, "ms", q.point, q.lower, q.upper, guard, f"{how} (p90 at {longest} tokens)")
            results.append(r)
        elif name in ("tpot_p90_ms", "tpot_p99_ms"):
            q = g.tpot.quantiles["p90" if name == "tpot_p90_ms" else "p99"]
            results.append(judge_bounded(name, limit, "ms", q.point, q.lower, q.upper, guard, how))
        elif name == "decode_tokens_per_s":
            point, lower, upper = g.decode_tokens_per_s()
            if lower >= limit * (1 + guard):
                verdict, reason = Verdict.PASS, f"lower bound {lower:.4g} tokens/s ≥ limit plus {guard:.0%} guard"
            elif upper < limit:
                verdict, reason = Verdict.FAIL, f"upper bound {upper:.4g} tokens/s < limit"
            else:
                verdict, reason = (
                    Verdict.INCONCLUSIVE,
                    (f"interval [{lower:.4g}, {upper:.4g}] tokens/s straddles the limit (or its guard band)"),
                )
            results.append(
                BudgetResult(
                    name,
                    limit,
                    "tokens/s",
                    verdict,
                    point,
                    (lower, upper),
                    f"{reason}; from the median time per token ({how})",
                )
            )
        elif name == "kv_cache_mb":
            kv = g.kv_cache_mb
            results.append(
                BudgetResult(
                    name,
                    limit,
                    "MB",
                    Verdict.PASS if kv <= limit else Verdict.FAIL,
                    kv,
                    None,
                    f"keys and values of {g.layout.layers} layers at max_context "
                    f"{g.workload.max_context} × batch {g.workload.batch} ({g.layout.dtype})",
                )
            )
        elif name == "greedy_min_agreement":
            if g.agreement is None:
                results.append(
                    BudgetResult(name, limit, "share", Verdict.UNMEASURED, reason="no greedy tokens were read")
                )
                continue
            diverged = [f for f in g.first_divergence if f is not None]
            results.append(
                BudgetResult(
                    name,
                    limit,
                    "share",
                    Verdict.PASS if g.agreement >= limit else Verdict.FAIL,
                    g.agreement,
                    None,
                    f"{len(g.first_divergence) - len(diverged)}/{len(g.first_divergence)} prompts match all "
                    f"{g.workload.compared_tokens} greedy tokens"
                    + (f"; first divergences at {diverged[:5]}" if diverged else ""),
                )
            )
    return results


def undecided(results: list[BudgetResult]) -> bool:
    """A budget more samples could decide: inconclusive, which a workload re-measures once before reporting."""
    return any(r.verdict == Verdict.INCONCLUSIVE for r in results)


def judge_stream(
    budgets: Budgets, s: StreamMeasurement | None, settings: CheckSettings, emulated: str | None
) -> list[BudgetResult]:
    """The stream workload's budgets: the chunk time's p99 with its bounds, the real-time factor over the range of the
    timed streams, the share of chunks past the deadline, and the streamed outputs' largest difference from the FP32
    reference over the golden stream. Through an emulator the timings are not judged; the drift is (the emulator
    computes what the NPU computes)."""
    asked = budgets.stream_budgets()
    if not asked:
        return []
    if s is None:
        return not_run(asked, 'the project\'s [workload] is not a stream: set kind = "stream" to measure one')
    guard = settings.guard_band
    results = []
    for name, limit in asked.items():
        unit = {"chunk_p99_ms": "ms", "stream_max_abs_error": "abs", "stream_max_rel_error": "of scale"}.get(
            name, "share" if "share" in name else "×"
        )
        if emulated and name not in ("stream_max_abs_error", "stream_max_rel_error"):
            results.append(
                BudgetResult(
                    name,
                    limit,
                    unit,
                    Verdict.UNMEASURED,
                    reason=f"emulated: {emulated}; run `tapeout check` on the device",
                )
            )
        elif name == "chunk_p99_ms":
            q = s.chunk.quantiles["p99"]
            results.append(
                judge_bounded(
                    name, limit, unit, q.point, q.lower, q.upper, guard, f"{settings.confidence:.0%} order-statistic"
                )
            )
        elif name == "real_time_factor":
            point, low, high = s.rtf()
            results.append(
                judge_bounded(
                    name, limit, unit, point, low, high, guard, f"range over {len(s.stream_rtf)} timed streams"
                )
            )
        elif name == "deadline_max_miss_share":
            share = s.misses / s.chunks_timed
            results.append(
                BudgetResult(
                    name,
                    limit,
                    unit,
                    Verdict.PASS if share <= limit else Verdict.FAIL,
                    share,
                    None,
                    f"{s.misses} of {s.chunks_timed} timed chunks over {s.workload.deadline_ms:g} ms",
                )
            )
        elif name in ("stream_max_abs_error", "stream_max_rel_error"):
            key = "max_abs" if name == "stream_max_abs_error" else "max_rel"
            worst = max(s.outputs_drift.items(), key=lambda kv: kv[1][key], default=None)
            where = (
                (
                    f"worst: {worst[0]} at chunk {worst[1]['worst_chunk']} (first chunk {worst[1]['first_chunk']:.3g}, "
                    f"last quarter {worst[1]['last_quarter_max']:.3g}"
                    + (f", largest magnitude {worst[1]['scale']:.3g})" if key == "max_rel" else ")")
                )
                if worst
                else "no output besides state"
            )
            value = s.max_abs_error if key == "max_abs" else s.max_rel_error
            results.append(
                BudgetResult(
                    name,
                    limit,
                    unit,
                    Verdict.PASS if value <= limit else Verdict.FAIL,
                    value,
                    None,
                    f"over {s.workload.chunks} chunks of the golden stream, state carried; {where}",
                )
            )
    return results


def not_run(asked: dict[str, float], why: str) -> list[BudgetResult]:
    """A workload's budgets where the build ran another kind: each unmeasured, with the reason."""
    return [BudgetResult(name, limit, "", Verdict.UNMEASURED, reason=why) for name, limit in asked.items()]


def judge_transcription(
    budgets: Budgets, t: TranscriptionMeasurement | None, settings: CheckSettings, emulated: str | None
) -> list[BudgetResult]:
    """The transcribe workload's budgets: the encoder, TTFT and the time per token at their percentiles with
    bounds, the real-time factor at the clip length worst off (p90), greedy agreement over the golden clips. For
    another workload they are unmeasured, with the reason; through an emulator the timings are not judged."""
    asked = budgets.transcription_budgets()
    if not asked:
        return []
    if t is None:
        return not_run(asked, 'the project\'s [workload] is not transcribe: set kind = "transcribe" to measure one')
    guard, how = settings.guard_band, f"{settings.confidence:.0%} order-statistic"
    results = []
    for name, limit in asked.items():
        unit = {"real_time_factor": "×", "greedy_min_agreement": "share"}.get(name, "ms")
        if emulated and name not in ("greedy_min_agreement", "max_wer"):
            reason = f"emulated: {emulated}; run `tapeout check` on the device"
            results.append(BudgetResult(name, limit, unit, Verdict.UNMEASURED, reason=reason))
        elif name in ("encoder_ms", "ttft_ms", "tpot_p90_ms", "tpot_p99_ms"):
            summary = {"encoder_ms": t.encoder, "ttft_ms": t.ttft}.get(name, t.tpot)
            q = summary.quantiles["p99" if name == "tpot_p99_ms" else "p90"]
            results.append(judge_bounded(name, limit, unit, q.point, q.lower, q.upper, guard, how))
        elif name == "real_time_factor":
            seconds, q = t.worst_rtf()
            what = f"{how} (p90 at the {seconds:g} s clip)"
            results.append(judge_bounded(name, limit, unit, q.point, q.lower, q.upper, guard, what))
        elif name == "max_wer":
            if t.wer is not None:
                wer, ref = t.wer["artifact"], t.wer["torch"]
                verdict = Verdict.PASS if wer <= limit else Verdict.FAIL
                why = f"over {len(t.wer['clips'])} golden clips against [workload] transcripts; torch's own: {ref:.3g}"
                results.append(BudgetResult(name, limit, "WER", verdict, wer, None, why))
            # else a check: the build's verdict is carried (steps/verdicts.carried)
        elif t.agreement is None:
            results.append(BudgetResult(name, limit, unit, Verdict.UNMEASURED, reason="no greedy tokens were read"))
        else:
            diverged = [f for f in t.first_divergence if f is not None]
            results.append(
                BudgetResult(
                    name,
                    limit,
                    unit,
                    Verdict.PASS if t.agreement >= limit else Verdict.FAIL,
                    t.agreement,
                    None,
                    f"{len(t.first_divergence) - len(diverged)}/{len(t.first_divergence)} clips match every greedy "
                    f"token up to the end token or {t.workload.agreement_tokens}"
                    + (f"; first divergences at {diverged[:5]}" if diverged else ""),
                )
            )
    return results

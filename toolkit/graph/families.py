"""Model families from what `graph.detect` found (attention blocks, a causal mask or KV-cache inputs, convolutions'
and recurrent cells' share of the MACs, a timestep input) and the Hugging Face config's model_type, each with a
confidence and its evidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tapeout.graph.analysis import FamilyScore

if TYPE_CHECKING:
    from tapeout.graph.detect import Detected

_ENCODER_TYPES = {
    "bert",
    "roberta",
    "distilbert",
    "xlm-roberta",
    "electra",
    "mpnet",
    "deberta",
    "deberta-v2",
    "vit",
    "deit",
    "albert",
    "camembert",
}
_DECODER_TYPES = {
    "gpt2",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi",
    "phi3",
    "gpt_neox",
    "opt",
    "gemma",
    "gemma2",
    "falcon",
    "bloom",
    "mixtral",
    "olmo",
}


def families(
    found: Detected,
    blocks: list,
    causal: bool,
    timestep: bool,
    conv_share: float,
    hints: dict,
    recurrent_share: float = 0.0,
    kv_inputs: list[str] | None = None,
) -> list[FamilyScore]:
    scores: list[FamilyScore] = []
    model_type = str(hints.get("model_type") or "").lower()
    hint_note = (f"Hugging Face config model_type = {model_type!r}",) if model_type else ()
    roles = found.roles.values()
    if blocks:
        norms = ", ".join(f"{v} {k}" for k, v in found.facts.get("norms", {}).items())
        ev = [f"{len(blocks)} attention block(s)", *((f"norms: {norms}",) if norms else ())]
        # the graph decides (a causal mask, or KV-cache inputs); a decoder config alone, with no mask found
        # (a pattern this detector does not know yet), still makes it a decoder, at lower confidence
        decoder_config = model_type in _DECODER_TYPES
        if causal or kv_inputs or decoder_config:
            has_head = "lm_head" in roles or (decoder_config and "head" in roles)
            conf = (0.9 if has_head else 0.7) if causal or kv_inputs else 0.75
            conf += 0.05 if decoder_config and (causal or kv_inputs) else 0.0
            why = [
                *(("causal mask on the attention scores",) if causal else ()),
                *((f"{len(kv_inputs)} KV-cache input(s), e.g. {kv_inputs[0]}",) if kv_inputs else ()),
                *(
                    ("no causal mask found in the graph: the decoder config decides",)
                    if not (causal or kv_inputs)
                    else ()
                ),
            ]
            scores.append(
                FamilyScore(
                    "decoder-llm",
                    min(conf, 0.99),
                    (*ev, *why, *(("vocabulary-sized LM head",) if has_head else ()), *hint_note),
                )
            )
        else:
            conf = 0.9 + (0.05 if model_type in _ENCODER_TYPES else 0.0)
            if timestep and conv_share > 0.3:
                scores.append(
                    FamilyScore(
                        "diffusion",
                        0.85,
                        (*ev, "float timestep input into Sin/Cos", f"conv MAC share {conv_share:.0%}"),
                    )
                )
                conf = 0.5
            scores.append(
                FamilyScore(
                    "transformer-encoder", min(conf, 0.99), (*ev, "no causal mask: bidirectional attention", *hint_note)
                )
            )
    if "recurrent_cell" in roles:
        # scored like the CNN family, by the share of the work: a CNN+LSTM is whichever does more of it
        # (a tie goes to the recurrent family, whose state is the more fragile to quantize)
        scores.append(
            FamilyScore(
                "speech-recurrent",
                0.6 + 0.35 * recurrent_share,
                ("recurrent ops (LSTM/GRU/RNN/Scan/Loop)", f"recurrent MAC share {recurrent_share:.0%}"),
            )
        )
    if conv_share > 0.3:
        if timestep:
            scores.append(
                FamilyScore("diffusion", 0.8, (f"conv MAC share {conv_share:.0%}", "float timestep input into Sin/Cos"))
            )
        else:
            scores.append(FamilyScore("cnn", 0.6 + 0.35 * conv_share, (f"conv MAC share {conv_share:.0%}",)))
    if not scores:
        scores.append(FamilyScore("mlp", 0.6, ("weighted MatMul/Gemm only, no attention, convolution or recurrence",)))
    return sorted(scores, key=lambda s: -s.confidence)

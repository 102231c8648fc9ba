"""The names PEFT's ``target_modules`` match in a transformers model, per family: what a LoRA plan costed with PEFT
adapts, and what its export writes.

PEFT matches each name against the module paths' suffixes (peft tuners_utils.py ``check_target_module_exists``) and
raises when none matches, so a name a family does not have trains nothing. The families' linears as transformers 5.23's
modeling files name them; a fused projection is one nn.Linear, which PEFT adapts whole (one A and one B):
- Llama and the families built like it (Mistral, Qwen 2/3, Gemma, OLMo, SmolLM3, GLM-4 but its MLP): q_proj, k_proj,
  v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head;
- GPT-2 (and GPTBigCode, the catalogue's "gpt"): c_attn (q, k and v fused), c_proj (the attention output and the MLP's
  down projection: one name, so both or neither), c_fc; GPT-NeoX, Falcon and BLOOM: query_key_value, dense,
  dense_h_to_4h, dense_4h_to_h (GPT-NeoX's output layer lm_head in 5.23, embed_out before); MPT: Wqkv, out_proj, up_proj, down_proj;
  Phi-3: qkv_proj, o_proj, gate_up_proj (gate and up fused), down_proj; Phi (1.5, 2): dense for the attention output,
  fc1, fc2; GLM-4: gate_up_proj.
"""

from __future__ import annotations

import functools

import numpy as np

from advisor.errors import PlanError

LLAMA = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
         "down": "down_proj", "head": "lm_head"}
_GPT2 = {"qkv": "c_attn", "o": "c_proj", "up": "c_fc", "down": "c_proj", "head": "lm_head"}
_NEOX = {"qkv": "query_key_value", "o": "dense", "up": "dense_h_to_4h", "down": "dense_4h_to_h", "head": "lm_head"}
NAMES: dict[str, dict[str, str]] = {
    "gpt": _GPT2, "gpt2": _GPT2, "gpt_bigcode": _GPT2,
    "gpt_neox": _NEOX, "falcon": _NEOX, "bloom": _NEOX,
    "mpt": {"qkv": "Wqkv", "o": "out_proj", "up": "up_proj", "down": "down_proj", "head": "lm_head"},
    "phi3": {"qkv": "qkv_proj", "o": "o_proj", "gate": "gate_up_proj", "up": "gate_up_proj", "gate_up": "gate_up_proj",
             "down": "down_proj", "head": "lm_head"},
    "phi": {**LLAMA, "o": "dense", "up": "fc1", "down": "fc2"},
    "glm4": {**LLAMA, "gate": "gate_up_proj", "up": "gate_up_proj", "gate_up": "gate_up_proj"},
}
# canonical targets that one module holds together: PEFT adapts all of them or none
_TOGETHER = (("o", "down"), ("gate", "up"))


class PeftTargetError(PlanError):
    """LoRA targets PEFT cannot adapt apart in this family's transformers modules."""


def target_modules(model, targets: tuple[str, ...]) -> list[str]:
    """PEFT's target_modules for the canonical ``targets`` (advisor.finetune) on ``model``'s family, in order; a one-line
    PeftTargetError where the family holds a target fused with another that is not asked, or has no such module."""
    names = NAMES.get(model.family, LLAMA)
    fused_qkv = "qkv" in names
    if fused_qkv and any(t in targets for t in ("q", "k", "v")):
        raise PeftTargetError(f"{model.name} holds q, k and v in one {names['qkv']} ({model.family} in transformers), "
                              f"which PEFT adapts whole: use --lora-targets {names['qkv']}")
    if not fused_qkv and "qkv" in targets:
        raise PeftTargetError(f"{model.name} holds q_proj, k_proj and v_proj apart ({model.family} in transformers): use "
                              "--lora-targets q_proj,k_proj,v_proj (PEFT adapts each), or --stack litgpt for a fused qkv")
    for a, b in _TOGETHER:
        if names.get(a) and names.get(a) == names.get(b) and (a in targets) != (b in targets):
            raise PeftTargetError(f"{model.name}'s {a} and {b} projections are one module, {names[a]}: PEFT adapts both "
                                  f"or neither (--lora-targets {names[a]})")
    return list(dict.fromkeys(names[t] for t in targets if t in names))


# PEFT's own defaults where target_modules is not given (peft 0.21 utils/constants.py
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING), as canonical targets (advisor.finetune)
DEFAULTS = {"gpt2": "qkv", "gpt": "qkv", "gpt_bigcode": "qkv", "bloom": "qkv", "gpt_neox": "qkv", "falcon": "qkv",
            "mpt": "qkv", "phi": "q,v,up,down"}


def default_targets(model) -> str:
    """PEFT's default targets for the model's family where DEFAULTS has one, else q and v (Llama's q_proj, v_proj):
    PEFT's own for Llama, Mistral, Qwen2/3, Gemma; for a family its mapping lacks (OLMo 2, Phi-3, GLM-4, SmolLM3, ...)
    PEFT raises "Please specify `target_modules`", so the exports write the q and v costed here explicitly."""
    return DEFAULTS.get(model.family, "q,v")


def runs_peft(ft, stack) -> bool:
    """Whether ``stack`` runs the adapters of ``ft`` as PEFT on transformers' modules (engine.base_modules)."""
    return ft.adapters and ft.library.value == "peft" and stack.engine.base_modules == "transformers"


def peft_targets(model, ft, stack):
    """``ft`` (advisor.finetune.FineTune) as PEFT runs it on ``model``'s transformers modules in ``stack``: on a family
    whose q, k and v are one module, all three (``all-linear``, PEFT's keyword, takes every linear) are that module, one
    adapter, as gate and up where they are one (Phi-3's and GLM-4's gate_up_proj); then checked (target_modules). Other stacks, libraries and full fine-tuning pass unchanged."""
    if not runs_peft(ft, stack):
        return ft
    names = NAMES.get(model.family, LLAMA)
    for parts, whole in ((("q", "k", "v"), "qkv"), (("gate", "up"), "gate_up")):  # one module, one adapter
        if whole in names:
            ft = _fused(ft, parts, whole)
    target_modules(model, ft.target_set)
    return ft


def targets_as_run(model, ft, stack):
    """``ft``'s LoRA targets as ``stack``'s adapter code takes them: PEFT's on transformers modules (peft_targets), or
    whole fused modules (engine.adapter_modules fused: Megatron's linear_fc1 holds gate and up, one adapter)."""
    if runs_peft(ft, stack):
        return peft_targets(model, ft, stack)
    return _fused(ft, ("gate", "up"), "gate_up") if ft.adapters and stack.engine.adapter_modules == "fused" else ft


def _fused(ft, parts: tuple[str, ...], whole: str):
    """``ft`` with the targets ``parts``, where it names them all, as the one target ``whole``."""
    t = set(ft.target_set)
    return ft.model_copy(update={"targets": ",".join(sorted(t - set(parts) | {whole}))}) if set(parts) <= t else ft


# the families whose transformers modules fuse them (the table above): advisor.adapters counts a quantised base's modules
# with them, advisor.parallel.data ZeRO-3's sub-modules
HF_FUSED_QKV = frozenset(f for f, names in NAMES.items() if "qkv" in names)
HF_FUSED_GATE_UP = frozenset(f for f, names in NAMES.items() if "gate_up" in names)


def largest_transformers_module(model, tp):
    """Weight elements (per TP rank) of a layer's largest module as transformers' modeling file holds it: q_proj,
    k_proj and v_proj apart (q's share of the fused table's qkv: heads / (heads + 2 kv heads)) and gate_proj apart from
    up_proj, except in the families above; other linears as the layer table holds them."""
    layer, kv = model.layer, model.n_kv_heads or model.n_heads
    out = []
    for lin in layer.linears:
        weights = lin.rank_weights(tp)
        if lin.name == "attention/qkv" and model.family not in HF_FUSED_QKV and model.latent is None:
            weights = weights * model.n_heads / (model.n_heads + 2 * kv)
        if lin.name == "mlp/gate" and model.family in HF_FUSED_GATE_UP:
            weights = weights * 2  # gate_up_proj: gate and up in one module
        out.append(weights)
    return functools.reduce(np.maximum, out)  # arrays over plans beside replicated linears' scalars


def fused_targets(targets: set) -> str:
    """Canonical LoRA targets (advisor.finetune) as a stack that adapts fused modules names them (megatron-core's
    linear_qkv, linear_proj, linear_fc1 as gate with up, linear_fc2: engine.adapter_modules fused), for a user to paste:
    all-linear -> qkv,o,gate,up,down; q,v (PEFT's default) -> qkv, with the modules not given named as wanted."""
    fused = [f for f, parts in (("qkv", {"q", "k", "v", "qkv"}), ("o", {"o"}), ("gate,up", {"gate", "up", "gate_up"}),
                                ("down", {"down"})) if targets & parts] or ["qkv"]
    more = [m for m in ("o", "gate,up", "down") if m not in fused]
    return ",".join(fused) + (f" (and {', '.join(more)} as wanted)" if more else "")

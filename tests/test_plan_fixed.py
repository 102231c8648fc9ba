"""plan's --recompute-modules and --etp: what estimate takes for one plan, fixed over a whole search (advisor.search)."""

import pytest

from advisor import estimate, plan
from advisor.errors import AdvisorError

# Qwen3-30B-A3B on two DGX H100 nodes: 128 experts of width 768 (its config.json), a search of about 0.7 s
QWEN = dict(model="qwen3-30b-a3b", hw="dgx-h100", gpus=16)


def _again(res, e):
    """estimate() of a search row, every field the row records passed back."""
    p, s = e.plan, e.setup
    return estimate(model=res.model_spec.name, hw=res.hardware.name, gpus=e.world_size, dp=p.dp, tp=p.tp, pp=p.pp,
                    zero=p.zero, sp=p.sp, schedule=p.schedule.value, virtual_stages=p.virtual_stages, cp=p.cp,
                    cp_comm=p.cp_comm.value if p.cp > 1 else None, pp_split=p.pp_split.value, ep=p.ep, etp=p.etp,
                    micro_batch=s.micro_batch, global_batch=res.global_batch, seq=s.seq_len,
                    recompute=s.recompute.value, recompute_layers=s.recompute_layers,
                    recompute_modules=",".join(s.recompute_modules) if s.recompute_modules else None,
                    offload=p.offload.value, stack=e.stack, precision=s.precision.value)


def test_recompute_modules_keeps_selective_plans_rerunning_them_and_each_row_is_its_estimate():
    # Megatron's --recompute-modules (megatron-core 0.19 transformer_config.py recompute_modules): what selective reruns
    res = plan(**QWEN, recompute_modules="moe_act,layernorm", top=3)
    assert res.plans and all(p.estimate.setup.recompute.value == "selective" for p in res.plans)
    assert all(p.estimate.setup.recompute_modules == ("moe_act", "layernorm") for p in res.plans)
    assert res.rejected["--recompute-modules moe_act,layernorm: selective recomputation only"] > 0
    assert "selective recomputation of moe_act,layernorm only" in res.header()
    for p in res.plans:
        assert _again(res, p.estimate).step_time_s == pytest.approx(p.estimate.step_time_s, rel=1e-9)
    # the modules change what is costed: the default selective (core_attn) ranks another step time
    default = plan(**QWEN, recompute_modules="core_attn", top=1).plans[0].estimate.step_time_s
    assert default != pytest.approx(res.plans[0].estimate.step_time_s, rel=1e-6)


def test_etp_fixes_expert_tensor_parallelism_and_counts_the_plans_it_cannot_hold():
    res = plan(**QWEN, etp=4, top=5)
    assert res.plans and all((p.plan.etp or p.plan.tp) == 4 for p in res.plans)
    # ep x etp must divide dp x cp x tp (megatron-core 0.19.2 parallel_state.py:874-884): dp x cp x tp = 8 or 16
    # holds etp 4; layouts of dp x cp x tp = 2 (pp 8) do not, counted under that reason
    assert res.rejected["ep x etp does not divide dp x cp x tp (EP is carved from a pipeline stage's ranks)"] > 0
    assert "expert tensor parallelism etp=4 only" in res.header() and res.to_json()["etp"] == 4
    for p in res.plans[:3]:
        assert _again(res, p.estimate).step_time_s == pytest.approx(p.estimate.step_time_s, rel=1e-9)


@pytest.mark.parametrize("kw, words", [
    (dict(model="gpt2", etp=2), "--etp 2: gpt2 has no routed experts (a dense model): drop --etp"),
    (dict(model="gpt2", etp=0), "--etp must be at least 1 (got 0)"),
    (dict(model="gpt2", recompute_modules="mla_up_proj", stack="megatron-core"),
     "--recompute-modules mla_up_proj needs multi-head latent attention, which gpt2 does not have"),
    (dict(model="gpt2", recompute_modules="core_attn", stack="deepspeed"),
     "stack deepspeed has no --recompute-modules (its selective recomputation is fixed): drop it"),
])
def test_plan_refuses_what_estimate_refuses_in_one_line(kw, words):
    with pytest.raises(AdvisorError) as err:
        plan(hw="dgx-h100", **kw)
    assert words in str(err.value) and "\n" not in str(err.value)

"""Tensor parallelism beyond the KV heads, stack by stack (engine.tp_beyond_kv_heads): megatron-core replicates a KV
head over tp / kv ranks; every other stack that offers TP takes only a tp that divides the KV heads, each for a
reason of its own library's code, run here where it runs on a CPU and cited where it does not. A refused plan is one
line naming tp, the KV heads, the largest tp the stack takes and the stacks that replicate; the search never
proposes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from advisor import estimate, plan
from advisor.errors import AdvisorError
from advisor.stack import list_stacks, load_stack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Qwen3-30B-A3B (config.json): 32 query heads, 4 KV heads: TP 8 on one DGX H100 is beyond its KV heads
QWEN = dict(seq=4096, global_batch=8)
REPLICATE = "--stack megatron-bridge-perf or megatron-core, which replicates each over tp / kv ranks"


def _refusal(stack: str, model: str = "qwen3-30b-a3b", hw: str = "dgx-h100", **kw) -> str:
    with pytest.raises(AdvisorError) as info:
        estimate(model, hw, stack=stack, **{**QWEN, **kw})
    assert "\n" not in str(info.value)
    return str(info.value)


def test_every_stack_that_offers_tp_states_its_rule():
    got = {n: st.engine.tp_beyond_kv_heads for n in list_stacks() if "tp" in (st := load_stack(n)).engine.offers}
    assert got == {"megatron-core": "replicate", "megatron-bridge-perf": "replicate", "megatron-deepspeed": "refuse",
                   "torchtitan": "refuse", "torchtitan-0.2": "refuse", "torchtitan-0.1": "refuse", "nanotron": "refuse",
                   "hf-trainer": "refuse"}


def test_megatron_core_replicates_kv_heads_past_the_query_groups():
    tc = pytest.importorskip("megatron.core.transformer.transformer_config")
    # megatron-core's own config (0.16.1 transformer_config.py:939-945; 0.19.2 :1338-1345) takes tp a multiple of the
    # query groups, each rank then keeping one (attention.py:289-295; 0.19.2 :353-367), and refuses 3 groups over 8
    tc.TransformerConfig(num_layers=1, hidden_size=1024, num_attention_heads=32, num_query_groups=4,
                         tensor_model_parallel_size=8)
    with pytest.raises(ValueError, match=r"num_query_groups \(3\) must be a multiple or divisor"):
        tc.TransformerConfig(num_layers=1, hidden_size=768, num_attention_heads=24, num_query_groups=3,
                             tensor_model_parallel_size=8)
    for stack in ("megatron-core", "megatron-bridge-perf"):
        assert estimate("qwen3-30b-a3b", "dgx-h100", stack=stack, tp=8, dp=1, **QWEN).plan.tp == 8


def test_torchtitan_030_refuses_tp_that_does_not_divide_the_kv_heads():
    pytest.importorskip("torchtitan")
    from torchtitan.config import ParallelismConfig
    from torchtitan.models.llama3 import llama3_configs

    # its own check (models/common/decoder.py:154-158) on its Llama 3 8B (32 heads, 8 KV heads), before any build
    for tp, ok in ((8, True), (16, False)):
        cfg = llama3_configs["8B"](attn_backend="flex")
        run = SimpleNamespace(parallelism=ParallelismConfig(tensor_parallel_degree=tp))
        if ok:
            cfg.update_from_config(config=run)
        else:
            with pytest.raises(ValueError, match=r"tensor_parallel_degree \(16\) must divide n_kv_heads \(8\)"):
                cfg.update_from_config(config=run)
    # the same plan in advisor, on an NVL72 rack (TP 16 inside its NVLink domain); megatron-core runs it
    msg = _refusal("torchtitan", "llama3-8b", "gb200-nvl72", tp=16, dp=1)
    assert ("tp does not divide the KV heads: tp=16, heads=32, kv heads=8 (tp that splits them: 1, 2, 4, 8); "
            "torchtitan takes only a tp that divides the KV heads, replicating none: --tp 8, or " + REPLICATE) in msg
    assert estimate("llama3-8b", "gb200-nvl72", stack="megatron-core", tp=16, dp=1, **QWEN).plan.tp == 16


def test_the_search_leaves_out_the_degrees_a_stack_refuses():
    # GLM-4-9B (config.json): 32 query heads, 2 KV heads; on 8 GPUs torchtitan's plans take tp 1 or 2, megatron-core's
    # up to 8 (a KV head on each of 4 ranks)
    titan = plan("glm-4-9b", "dgx-h100", gpus=8, stack="torchtitan", top=100_000, **QWEN)
    assert {r.plan.tp for r in titan.plans} == {1, 2} and titan.rejected["tp does not divide the KV heads"] > 0
    megatron = plan("glm-4-9b", "dgx-h100", gpus=8, stack="megatron-core", top=100_000, **QWEN)
    assert {r.plan.tp for r in megatron.plans} == {1, 2, 4, 8}
    assert "tp does not divide the KV heads" not in megatron.rejected


_TITAN02 = '''
import json
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
import torchtitan
from torchtitan.models.llama3.infra.parallelize import apply_tp
from torchtitan.models.llama3.model.args import TransformerModelArgs
from torchtitan.models.llama3.model.model import Transformer
out = {"file": torchtitan.__file__}
dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())  # rank 0 of 8, collectives not run
mesh = init_device_mesh("cpu", (8,))
for kv in (8, 4):
    m = Transformer(TransformerModelArgs(dim=256, n_layers=1, n_heads=8, n_kv_heads=kv, vocab_size=64, max_seq_len=16))
    with torch.no_grad():
        m.init_weights()
    apply_tp(m, mesh, loss_parallel=False, enable_float8_tensorwise_tp=False)
    try:
        m(torch.zeros(1, 16, dtype=torch.long))
        out[kv] = "ran"
    except RuntimeError as exc:
        out[kv] = str(exc)
print(json.dumps(out))
'''


@pytest.mark.slow  # ~10 s: a subprocess imports torchtitan 0.2.2 (tests/test_export_stacks.py's install)
def test_torchtitan_022_fails_where_a_rank_holds_part_of_a_kv_head():
    """0.2.2 checks nothing: apply_tp shards wk and wv column-wise (models/llama3/infra/parallelize.py:230-231) and
    the attention views a rank's k as whole heads (models/llama3/model/model.py:257), which raises at the first
    forward where tp exceeds the KV heads. Run on rank 0 of 8 over torch's fake process group."""
    root = os.environ.get("ADVISOR_TORCHTITAN_02") or os.path.join(ROOT, ".torchtitan-0.2")
    if not os.path.isfile(os.path.join(root, "torchtitan", "models", "llama3", "infra", "parallelize.py")):
        pytest.skip("set ADVISOR_TORCHTITAN_02 to a directory with torchtitan 0.2.2 (pip install --no-deps --target)")
    run = subprocess.run([sys.executable, "-c", _TITAN02], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])})
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(os.path.abspath(root))
    # 8 heads of 32 over 8 ranks: with 8 KV heads a rank holds one; with 4, half of one (16 of 32 elements a token)
    assert got["8"] == "ran" and got["4"] == "shape '[1, 16, -1, 32]' is invalid for input of size 256"
    msg = _refusal("torchtitan-0.2", gpus=16, tp=8, dp=2, zero=3)
    assert "kv heads=4 (tp that splits them: 1, 2, 4); torchtitan-0.2 takes only a tp that divides the KV heads" in msg


_HF_TP = '''
import json
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.distributed.tensor_parallel import apply_tensor_parallelism
dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())
mesh, out = init_device_mesh("cpu", (8,)), {}
for kv in (8, 4):
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=8,
                      num_key_value_heads=kv, head_dim=32, vocab_size=64)
    m = LlamaForCausalLM(cfg)
    apply_tensor_parallelism(m, mesh, m._expand_parallel_plan({f"model.{k}": v for k, v in cfg.base_model_tp_plan.items()}))
    try:
        m(torch.tensor([[1, 2, 3]]))
        out[kv] = "ran"
    except RuntimeError as exc:
        out[kv] = str(exc)
print(json.dumps(out))
'''


@pytest.mark.slow  # ~10 s: a subprocess imports transformers and builds a one-layer Llama
def test_hf_trainer_takes_only_tp_that_divides_the_kv_heads():
    """transformers 5.23's own tp_plan (k_proj / v_proj colwise, distributed/tensor_parallel.py:143-167) leaves a rank
    half a KV head, which LlamaAttention's view to whole heads refuses (modeling_llama.py:241-245); run on rank 0 of
    8 over torch's fake process group."""
    pytest.importorskip("transformers")
    run = subprocess.run([sys.executable, "-c", _HF_TP], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["8"] == "ran" and got["4"] == "shape '[1, 3, -1, 32]' is invalid for input of size 48"


def test_deepspeed_autotp_idles_the_ranks_past_the_kv_heads():
    """DeepSpeed 0.19.8's AutoTP (the Trainer's TP: ds_config tensor_parallel.autotp_size) splits attention by whole
    KV groups (module_inject/tp_shard.py:120-123): past the KV heads a rank gets no q, k or v columns and idles
    through attention (runtime/engine.py:1043-1052 warns so), which advisor does not cost: hf-trainer refuses it."""
    tp_shard = pytest.importorskip("deepspeed.module_inject.tp_shard")
    meta = tp_shard.AutoTPMeta(num_kv_heads=4)
    # 8 query heads of 32 and 4 KV heads over 8 ranks: the first 4 ranks take a KV group each, with its 2 query heads
    assert tp_shard.get_shard_size_list(8 * 32, 8, meta, "model.layers.0.self_attn.q_proj") == [64] * 4 + [0] * 4
    assert tp_shard.get_shard_size_list(4 * 32, 8, meta, "model.layers.0.self_attn.k_proj") == [32] * 4 + [0] * 4
    msg = _refusal("hf-trainer", tp=8, dp=1)
    assert "hf-trainer takes only a tp that divides the KV heads, replicating none: --tp 4, or " + REPLICATE in msg


def test_nanotron_asserts_tp_divides_the_kv_heads():
    """nanotron 0.4's CausalSelfAttention asserts it (models/llama.py:271-274; the module imports flash_attn, which
    does not build on CPU: the source is read, not run)."""
    pytest.importorskip("nanotron")
    import importlib.util

    path = importlib.util.find_spec("nanotron").submodule_search_locations[0] + "/models/llama.py"
    lines = open(path).read().splitlines()
    assert "config.num_key_value_heads % tp_pg.size() == 0" in lines[272]
    assert "must be divisible by TP size" in lines[273]
    msg = _refusal("nanotron", "smollm3-3b", tp=8, dp=1)  # 16 heads, 4 KV heads (config.json)
    assert "tp=8, heads=16, kv heads=4 (tp that splits them: 1, 2, 4); nanotron takes only" in msg


def test_megatron_deepspeed_refuses_as_megatron_core_0_8_did():
    """megatron-core 0.8.0 (July 2024, after the 2023 fork; the fork's source is not on PyPI): transformer_config.py:
    311-315 raises unless tp divides num_query_groups (not installed here: cited)."""
    msg = _refusal("megatron-deepspeed", "glm-4-9b", tp=8, dp=1)  # 32 heads, 2 KV heads (config.json)
    assert "tp=8, heads=32, kv heads=2 (tp that splits them: 1, 2); megatron-deepspeed takes only a tp" in msg
    assert "--tp 2, or " + REPLICATE in msg

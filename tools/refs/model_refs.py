"""Tiny random checkpoints saved by transformers, with fp32 reference logits and greedy tokens.

Each variant exercises one loading/forward feature (rope style and type, qkv bias, q/k norm,
head_dim != hidden/heads, tied embeddings, sharding, storage dtype, DeepSeek MLA/MoE routing).
Weights are initialised with a large scale (and random norm weights and biases, never the
defaults) so that next-token distributions are peaked and every parameter matters.
"""
import json
import os
import shutil
import traceback
import zlib

import torch
from safetensors.torch import save_file

VOCAB = 320
N_GREEDY = 24
PROMPT_LENS = [7, 19, 33]


def base(**kw):
    d = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5, initializer_range=0.5, tie_word_embeddings=False,
             bos_token_id=1, eos_token_id=2, pad_token_id=None)
    d.update(kw)
    return d


def rope(kind="default", theta=10000.0, **kw):
    d = {"rope_type": kind, "rope_theta": theta}
    d.update(kw)
    return d


LLAMA3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
YARN = dict(factor=4.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0)
DS_YARN = dict(factor=4.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0,
               mscale=0.707, mscale_all_dim=0.707)

DEEPSEEK = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.5,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)

# name: (config class name, config kwargs, options)
VARIANTS = {
    "llama": ("LlamaConfig", base(rope_parameters=rope()), {"dtype": "float32"}),
    "llama3_rope_old_style": ("LlamaConfig", base(rope_parameters=rope("llama3", 500000.0, **LLAMA3)),
                              {"dtype": "bfloat16", "old_style": "rope_type"}),
    "llama3_rope_new_style": ("LlamaConfig", base(rope_parameters=rope("llama3", 500000.0, **LLAMA3)),
                              {"dtype": "float32"}),
    "llama_linear_rope_type_key": ("LlamaConfig", base(rope_parameters=rope("linear", 10000.0, factor=2.0),
                                                       attention_bias=True, mlp_bias=True),
                                   {"dtype": "float32", "old_style": "type"}),
    "qwen2_bias_tied": ("Qwen2Config", base(rope_parameters=rope("default", 1000000.0), tie_word_embeddings=True),
                        {"dtype": "float16"}),
    "qwen3_qknorm_headdim": ("Qwen3Config", base(rope_parameters=rope("default", 1000000.0), head_dim=32),
                             {"dtype": "bfloat16"}),
    "qwen3_yarn_tied": ("Qwen3Config", base(rope_parameters=rope("yarn", 10000.0, **YARN), head_dim=16,
                                            tie_word_embeddings=True), {"dtype": "float32"}),
    "mistral_sharded": ("MistralConfig", base(rope_parameters=rope("default", 1000000.0), sliding_window=None,
                                              head_dim=16), {"dtype": "float32", "shard": "60KB"}),
    "deepseek_v2_group_limited": ("DeepseekV2Config", dict(DEEPSEEK, q_lora_rank=None, topk_method="group_limited_greedy",
                                                           n_group=2, topk_group=1, routed_scaling_factor=1.0,
                                                           norm_topk_prob=False,
                                                           rope_parameters=rope("yarn", 10000.0, **DS_YARN)),
                                  {"dtype": "bfloat16"}),
    "deepseek_v2_greedy": ("DeepseekV2Config", dict(DEEPSEEK, q_lora_rank=None, topk_method="greedy",
                                                    n_group=1, topk_group=1, routed_scaling_factor=1.0,
                                                    rope_parameters=rope()), {"dtype": "float32"}),
    "deepseek_v3": ("DeepseekV3Config", dict(DEEPSEEK, q_lora_rank=32, n_group=2, topk_group=1,
                                             norm_topk_prob=True, routed_scaling_factor=2.5,
                                             rope_parameters=rope("yarn", 10000.0, **DS_YARN)),
                    {"dtype": "bfloat16"}),
    "deepseek_v3_no_qlora": ("DeepseekV3Config", dict(DEEPSEEK, q_lora_rank=None, n_group=4, topk_group=2,
                                                      norm_topk_prob=False, routed_scaling_factor=1.5,
                                                      rope_parameters=rope()), {"dtype": "float32"}),
}


def randomize(model, gen):
    """Norm weights around 1, biases and routing biases small but non-zero."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                noise = torch.randn(p.shape, generator=gen)
                if "norm" in name:
                    p.copy_(1.0 + 0.2 * noise)
                else:
                    p.copy_(0.1 * noise)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def to_old_style(cfg_path, key):
    """Rewrites transformers-5 rope_parameters as the older rope_theta + rope_scaling keys."""
    with open(cfg_path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    kind = rp.pop("rope_type")
    cfg["rope_scaling"] = None if kind == "default" else dict({key: kind}, **rp)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)


def make_variant(name, cls_name, kw, opts, out_root):
    import transformers
    from transformers import AutoModelForCausalLM

    out = os.path.join(out_root, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cfg = getattr(transformers, cls_name)(**kw)
    seed = zlib.crc32(name.encode())  # stable across processes, unlike hash()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(model, gen)
    dtype = getattr(torch, opts["dtype"])
    save_kw = {}
    if "shard" in opts:
        save_kw["max_shard_size"] = opts["shard"]
    model.to(dtype).save_pretrained(out, **save_kw)
    for extra in os.listdir(out):  # keep config + weights only
        if extra not in ("config.json",) and not extra.startswith("model"):
            os.remove(os.path.join(out, extra))
    check = None
    if "old_style" in opts:
        # Keep the transformers-5 spelling aside: the old spelling must load to the same model.
        check = out + "_new_style_check"
        shutil.rmtree(check, ignore_errors=True)
        shutil.copytree(out, check)
        to_old_style(os.path.join(out, "config.json"), opts["old_style"])

    ref = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    other = None
    if check:
        other = AutoModelForCausalLM.from_pretrained(check, dtype=torch.float32, attn_implementation="eager").eval()
    gen2 = torch.Generator().manual_seed(7)
    tensors = {}
    peak = []
    margins = []  # top-1 minus top-2 logit at each greedy step: a near tie would make greedy fragile
    with torch.no_grad():
        for i, n in enumerate(PROMPT_LENS):
            prompt = torch.randint(3, VOCAB, (n,), generator=gen2)
            logits = ref(input_ids=prompt[None]).logits[0].float()
            if other is not None:
                diff = (logits - other(input_ids=prompt[None]).logits[0].float()).abs().max().item()
                assert diff <= 1e-5 * logits.abs().max().item(), f"{name}: old-style config loads differently ({diff})"
            ids = prompt.clone()
            for _ in range(N_GREEDY):
                last = ref(input_ids=ids[None]).logits[0, -1]
                top2 = last.topk(2).values
                margins.append((top2[0] - top2[1]).item())
                ids = torch.cat([ids, last.argmax()[None]])
            tensors[f"prompt_{i}"] = prompt.to(torch.int32).contiguous()
            tensors[f"logits_{i}"] = logits.contiguous()
            tensors[f"greedy_{i}"] = ids[n:].to(torch.int32).contiguous()
            peak.append(torch.softmax(logits, -1).max(-1).values.mean().item())
    save_file(tensors, os.path.join(out, "reference.safetensors"), metadata={
        "generator": f"transformers {transformers.__version__}, torch {torch.__version__}, fp32 eager",
        "variant": name})
    if check:
        shutil.rmtree(check)
    rp = getattr(ref.config, "rope_parameters", None)
    files = sorted(os.listdir(out))
    print(f"models/{name}: {cls_name} saved {opts['dtype']}, files={files}, "
          f"mean max-prob={sum(peak)/len(peak):.3f}, min greedy margin={min(margins):.4f}, rope={rp}")


def make_model_refs(out_root):
    os.makedirs(out_root, exist_ok=True)
    failed = []
    for name, (cls_name, kw, opts) in VARIANTS.items():
        try:
            make_variant(name, cls_name, kw, opts, out_root)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            shutil.rmtree(os.path.join(out_root, name), ignore_errors=True)
    print("model refs failed:", failed)

"""DeepSeek-V3 multi-token prediction, depth 1, built from transformers' own DeepSeek-V3 modules.

For main-model position i with final hidden state h_i (the output of the main model's last norm,
`model.norm`, i.e. what DeepseekV3Model returns as last_hidden_state and what vLLM hands its MTP
proposer) and the next token t_{i+1}:

    e_i  = embed_tokens(t_{i+1}), set to zero where the position i == 0 (as vLLM's MTP layer does)
    x_i  = eh_proj(concat(enorm(e_i), hnorm(h_i)))          # [2H] -> [H], no bias
    y    = one DeepSeek-V3 MoE decoder block over x (causal attention with its own KV, rope at
           position i), then shared_head.norm
    logits_i = shared_head.head(y_i)                        # predicts t_{i+2}

The block is transformers' DeepseekV3DecoderLayer inside a one-layer DeepseekV3Model whose config
says first_k_dense_replace = 0 (so its block is a MoE block like the main model's MoE layers) and
whose final norm plays shared_head.norm. In the checkpoint the MTP layer lives under
model.layers.{num_hidden_layers}.: enorm, hnorm, eh_proj, embed_tokens, shared_head.norm,
shared_head.head and the block's own self_attn.*, mlp.*, input_layernorm, post_attention_layernorm.
"""
import copy
import os
import tempfile

import torch
from safetensors.torch import load_file, save_file
from torch import nn

INPUT_KEYS = ("enorm.weight", "hnorm.weight", "eh_proj.weight")


def mtp_config(main_config):
    d = main_config.to_dict()
    for derived in ("layer_types", "mlp_layer_types"):
        d.pop(derived, None)
    d.update(num_hidden_layers=1, first_k_dense_replace=0, num_nextn_predict_layers=0)
    return type(main_config).from_dict(d)


class MtpInput(nn.Module):
    def __init__(self, config):
        super().__init__()
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

        h = config.hidden_size
        self.enorm = DeepseekV3RMSNorm(h, eps=config.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(h, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)

    def forward(self, token_embeds, hidden, positions):
        token_embeds = token_embeds.masked_fill((positions == 0)[..., None], 0.0)
        return self.eh_proj(torch.cat([self.enorm(token_embeds), self.hnorm(hidden)], dim=-1))


class Mtp(nn.Module):
    """`lm` is a one-layer DeepseekV3ForCausalLM: its embed_tokens / lm_head are the MTP layer's
    embed_tokens / shared_head.head, its norm is shared_head.norm."""

    def __init__(self, mtp_input, lm):
        super().__init__()
        self.input = mtp_input
        self.lm = lm
        mlp = lm.model.layers[0].mlp
        assert hasattr(mlp, "gate"), f"the MTP block must be a MoE block, got {type(mlp).__name__}"

    def forward(self, next_ids, hidden, positions):
        x = self.input(self.lm.model.embed_tokens(next_ids), hidden, positions)
        y = self.lm.model(inputs_embeds=x, position_ids=positions, use_cache=False).last_hidden_state
        return self.lm.lm_head(y)


def new_mtp(main, attn_implementation):
    """A fresh MTP layer sharing the main model's embedding and output head, as in the report."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_config(mtp_config(main.config), attn_implementation=attn_implementation,
                                          dtype=torch.float32)
    lm.model.embed_tokens = main.model.embed_tokens
    lm.lm_head = main.lm_head
    return Mtp(MtpInput(main.config), lm)


def positions_like(ids):
    return torch.arange(ids.shape[1], device=ids.device)[None, :].expand(ids.shape[0], -1)


def save_mtp(folder, mtp, num_hidden_layers):
    """Appends the MTP layer to folder/model.safetensors under DeepSeek-V3's names. The block goes
    through transformers' own save_pretrained, so its experts get the checkpoint's per-expert
    names whatever layout transformers keeps them in memory."""
    prefix = f"model.layers.{num_hidden_layers}."
    extra = {}
    with tempfile.TemporaryDirectory() as tmp:
        lm = copy.deepcopy(mtp.lm).to(torch.bfloat16)
        lm.save_pretrained(tmp)
        files = [f for f in os.listdir(tmp) if f.endswith(".safetensors")]
        assert files == ["model.safetensors"], f"MTP block saved as {files}"
        block = load_file(os.path.join(tmp, "model.safetensors"))
    embed = block.pop("model.embed_tokens.weight")
    head = block.pop("lm_head.weight", embed)  # absent when the config ties them
    for k, v in block.items():
        if k.startswith("model.layers.0."):
            extra[prefix + k[len("model.layers.0."):]] = v
        elif k == "model.norm.weight":
            extra[prefix + "shared_head.norm.weight"] = v
        else:
            raise ValueError(f"unexpected tensor {k} in the saved MTP block")
    extra[prefix + "embed_tokens.weight"] = embed.clone()
    extra[prefix + "shared_head.head.weight"] = head.clone()
    for k, v in mtp.input.state_dict().items():
        extra[prefix + k] = v.detach().to(torch.bfloat16).cpu().clone()
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    clash = set(tensors) & set(extra)
    assert not clash, f"MTP names clash with the main model: {sorted(clash)[:3]}"
    tensors.update({k: v.contiguous() for k, v in extra.items()})
    save_file(tensors, path, metadata={"format": "pt"})
    return sorted(extra)


def load_mtp(folder, dtype=torch.float32, attn_implementation="eager", device="cpu"):
    """Rebuilds the MTP layer from a checkpoint folder. The block and head are loaded by
    transformers' own from_pretrained (after renaming model.layers.{N}. to a one-layer model's
    names), which must find every tensor and nothing else."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(folder)
    prefix = f"model.layers.{cfg.num_hidden_layers}."
    tensors = {k[len(prefix):]: v for k, v in load_file(os.path.join(folder, "model.safetensors")).items()
               if k.startswith(prefix)}
    if not tensors:
        raise ValueError(f"{folder}: no MTP layer ({prefix}*) in model.safetensors")
    inputs, renamed = {}, {}
    for rest, v in tensors.items():
        if rest in INPUT_KEYS:
            inputs[rest] = v
        elif rest == "embed_tokens.weight":
            renamed["model.embed_tokens.weight"] = v
        elif rest == "shared_head.head.weight":
            renamed["lm_head.weight"] = v
        elif rest == "shared_head.norm.weight":
            renamed["model.norm.weight"] = v
        else:
            renamed["model.layers.0." + rest] = v
    missing_inputs = set(INPUT_KEYS) - set(inputs)
    if missing_inputs:
        raise ValueError(f"{folder}: MTP layer lacks {sorted(prefix + k for k in missing_inputs)}")
    mcfg = mtp_config(cfg)
    mcfg.tie_word_embeddings = False  # the checkpoint stores both
    with tempfile.TemporaryDirectory() as tmp:
        mcfg.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in renamed.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        lm, info = AutoModelForCausalLM.from_pretrained(
            tmp, dtype=dtype, attn_implementation=attn_implementation, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k != "error_msgs" and v}
    if bad or info.get("error_msgs"):
        raise ValueError(f"{folder}: MTP block did not load cleanly: {bad} {info.get('error_msgs')}")
    mtp_input = MtpInput(cfg)
    mtp_input.load_state_dict({k: v.to(dtype) for k, v in inputs.items()})
    return Mtp(mtp_input.to(dtype), lm).to(device).eval()

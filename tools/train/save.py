"""Writes a trained model as a standard HF folder and proves transformers loads it back exactly.

The folder holds config.json, generation_config.json, model.safetensors (bf16, written by
transformers' save_pretrained), tokenizer.json and tokenizer_config.json. Verification reloads the
folder with AutoModelForCausalLM in fp32 and compares its logits with the in-memory model rounded
to bf16 the same way (so only kernel order can differ); the MTP layer is reloaded with
mtp.load_mtp and compared likewise.
"""
import copy
import json
import os
import shutil

import torch

from common import exact_fp32, load_hf, log
from configs import ENDOFTEXT_ID, IM_END_ID

KEEP = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


def save_hf(model, folder, tokenizer_dir, extra_config=None):
    from transformers import GenerationConfig

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(folder)
    # A base model of source files: it ends a file with <|endoftext|> and a chat answer with
    # <|im_end|>; generation stops at either.
    GenerationConfig(bos_token_id=None, eos_token_id=[ENDOFTEXT_ID, IM_END_ID],
                     pad_token_id=ENDOFTEXT_ID).save_pretrained(folder)
    if extra_config:
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg.update(extra_config)
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(folder, name))
    stray = sorted(set(os.listdir(folder)) - KEEP)
    for name in stray:
        os.remove(os.path.join(folder, name))
    if stray:
        log(f"save: removed extra files {stray}")
    sizes = {n: os.path.getsize(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}
    log(f"save: {folder} {sizes}")
    return sizes


def _bf16_rounded(module):
    """A copy whose weights went through bf16 like the saved file's. Rope frequencies (buffers that
    are recomputed in fp32 on load, never saved) are left alone."""
    out = copy.deepcopy(module).float().eval()
    with torch.no_grad():
        for p in out.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        for name, b in out.named_buffers():
            if "inv_freq" not in name and b.is_floating_point():
                b.copy_(b.to(torch.bfloat16).float())
    return out


def _compare(name, ref, got):
    diff = (ref - got).abs()
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    out = {"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(), "argmax_agreement": agree}
    log(f"verify {name}: {out}")
    assert out["mean_abs_diff"] < 1e-3 and agree > 0.99, f"{name}: reloaded model differs: {out}"
    return out


@torch.no_grad()
def verify(model, folder, sample, mtp=None):
    """sample: [B, T+1] token ids on the model's device."""
    from mtp import load_mtp, positions_like

    exact_fp32()
    dev = sample.device
    loaded, info = load_hf(folder, torch.float32, "sdpa", dev)
    n = loaded.config.num_hidden_layers
    unexpected = list(info.get("unexpected_keys", []))
    missing = list(info.get("missing_keys", []))
    assert not missing, f"{folder}: transformers found no tensor for {missing[:5]}"
    assert all(k.startswith(f"model.layers.{n}.") for k in unexpected), f"{folder}: unexpected {unexpected[:5]}"
    tied = loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert tied == bool(loaded.config.tie_word_embeddings), f"{folder}: tie_word_embeddings not honoured"
    x = sample[:, :-1]
    ref = _bf16_rounded(model)
    report = {"logits": _compare("logits", ref(input_ids=x).logits.float(), loaded(input_ids=x).logits.float()),
              "unexpected_keys_on_load": len(unexpected), "missing_keys_on_load": 0,
              "loading_info_other": {k: len(v) if hasattr(v, "__len__") else str(v) for k, v in info.items()
                                     if k not in ("unexpected_keys", "missing_keys")}}
    if mtp is not None:
        if not unexpected:
            log(f"verify: transformers loaded {folder} without reporting the MTP tensors (ignored silently)")
        got = load_mtp(folder, torch.float32, "sdpa", dev)
        h = loaded.model(input_ids=x, use_cache=False).last_hidden_state
        pos = positions_like(x)
        next_ids = sample[:, 1:]
        report["mtp_logits"] = _compare("mtp", _bf16_rounded(mtp)(next_ids, h, pos).float(),
                                        got(next_ids, h, pos).float())
    del ref
    return report

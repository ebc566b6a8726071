"""EAGLE-3 head for specula-tiny: build, train (training-time test), save, evaluate, fixtures.

The checkpoint (models/specula-tiny-eagle3/) is in vLLM's / SpecForge's EAGLE-3 layout: config.json
(LlamaForCausalLMEagle3) and model.safetensors with midlayer.*, norm, fc, lm_head (bf16), d2t
(int64) and t2d (bool); no embedding: the head reads the target's model.embed_tokens.

The computation (the C++ engine implements the same). Target features: feat(p) =
concat(hs[2][p], hs[4][p], hs[5][p]) where hs[i] is the residual stream entering target decoder
layer i (transformers' output_hidden_states[i]). The head's row at position p reads a hidden input
g and the NEXT token t_{p+1}, runs at RoPE position p and predicts t_{p+2}:

    e = target_embed[t_{p+1}]
    g = fc(feat(p)) for target-fed rows; the previous draft step's `prenorm` for chained rows
    x = concat(input_layernorm(e), hidden_norm(g))                    # [2H]
    q, k, v = q_proj(x), k_proj(x), v_proj(x); rotate_half RoPE on q, k at position p
    a = o_proj(causal GQA attention over the head's own keys/values)   # scale 1/sqrt(head_dim)
    r = a + g;  prenorm = mlp(post_attention_layernorm(r)) + r
    draft_logits = lm_head(norm(prenorm))                              # draft vocabulary
    target id of draft id i = i + d2t[i]

Inference with last accepted position p0: step 1 is the target-fed row at p0 (token t_{p0+1});
step s > 1 is the row at p0 + s - 1 with g = prenorm of step s-1 and the token drafted by step
s-1; it attends to the target-fed rows at positions <= p0 and to its own chain.

Training-time test (TTT, S steps): step 0 runs every row with g = fc(feat); step s runs row p with
g = prenorm of step s-1 at p-1, token t_{p+1} (teacher forced), position p, attending to step-0
keys at positions <= p-s and to step-j keys at position p-s+j (j = 1..s): row p of step s is
the (s+1)-th draft of the chain rooted at p0 = p-s. Rows p < s have no chain root and are left
out of the loss. Every row's label is the target's own next-token distribution at position p+1
restricted to the draft vocabulary and renormalised; loss = sum_s 0.8^s * soft cross-entropy.
"""
import json
import math
import os
import shutil

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from configs import (EAGLE3, EAGLE3_AUX_LAYERS, EAGLE3_MASK_OUT_OF_VOCAB, EAGLE3_STEP_DECAY, EAGLE3_TTT_STEPS,
                     ENDOFTEXT_ID, MAX_POSITIONS, NAMES, TRAIN)

AUX = tuple(EAGLE3_AUX_LAYERS)


def checkpoint_config():
    c = EAGLE3
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": c["hidden_size"], "intermediate_size": c["intermediate_size"],
            "num_attention_heads": c["num_attention_heads"], "num_key_value_heads": c["num_key_value_heads"],
            "head_dim": c["head_dim"], "num_hidden_layers": 1, "rms_norm_eps": c["rms_norm_eps"],
            "rope_theta": c["rope_theta"], "max_position_embeddings": MAX_POSITIONS, "hidden_act": "silu",
            "vocab_size": c["vocab_size"], "draft_vocab_size": c["draft_vocab_size"],
            "target_hidden_size": c["target_hidden_size"], "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "bos_token_id": None, "eos_token_id": ENDOFTEXT_ID,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX), "use_aux_hidden_state": True}}


def expected_tensors():
    """name -> (shape, safetensors dtype) of the checkpoint, exactly."""
    c = EAGLE3
    h, f, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    qd, kd = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    m = "midlayer."
    out = {m + "input_layernorm.weight": [h], m + "hidden_norm.weight": [h],
           m + "self_attn.q_proj.weight": [qd, 2 * h], m + "self_attn.k_proj.weight": [kd, 2 * h],
           m + "self_attn.v_proj.weight": [kd, 2 * h], m + "self_attn.o_proj.weight": [h, qd],
           m + "post_attention_layernorm.weight": [h], m + "mlp.gate_proj.weight": [f, h],
           m + "mlp.up_proj.weight": [f, h], m + "mlp.down_proj.weight": [h, f], "norm.weight": [h],
           "fc.weight": [h, len(AUX) * c["target_hidden_size"]], "lm_head.weight": [c["draft_vocab_size"], h]}
    out = {k: (v, "BF16") for k, v in out.items()}
    out["d2t"] = ([c["draft_vocab_size"]], "I64")
    out["t2d"] = ([c["vocab_size"]], "BOOL")
    return out


# ---------------------------------------------------------------------------------------------
# The head


class RMSNorm(nn.Module):
    """HF LlamaRMSNorm: normalised in fp32, cast back, times the weight."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dt)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.q_proj = nn.Linear(2 * h, c["num_attention_heads"] * d, bias=False)
        self.k_proj = nn.Linear(2 * h, c["num_key_value_heads"] * d, bias=False)
        self.v_proj = nn.Linear(2 * h, c["num_key_value_heads"] * d, bias=False)
        self.o_proj = nn.Linear(c["num_attention_heads"] * d, h, bias=False)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = Mlp(c)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(x, pos, theta):
    """x [B, heads, N, D], pos [B, N]: Llama/Qwen rotate_half RoPE over the full head_dim, cos/sin
    computed in fp32 (as transformers does) and cast to x's dtype."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=x.device).float() / d))
    freqs = pos[..., None].float() * inv
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, N, D]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


def attend(q, k, v, mask):
    """q [B, H, N, D]; k, v [B, Hkv, M, D]; mask bool, True = attend, broadcastable to [B, H, N, M].
    Query head h reads kv head h // (H / Hkv), as in transformers' repeat_kv."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # torch < 2.0 (local CPU checks)
    s = s.float().masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1).to(v.dtype) @ v


_MASKS = {}


def ttt_mask(n, s, device):
    """[n, n * (s + 1)] bool: row p of step s sees step-0 keys at positions <= p - s and step-j keys
    (j = 1..s) at position p - s + j."""
    key = (n, s, str(device))
    if key not in _MASKS:
        p = torch.arange(n, device=device)[:, None]
        kp = torch.arange(n, device=device)[None, :]
        _MASKS[key] = torch.cat([kp <= p - s] + [kp == p - s + j for j in range(1, s + 1)], 1)
    return _MASKS[key]


class Eagle3Head(nn.Module):
    def __init__(self, draft_vocab, c=EAGLE3):
        """draft_vocab: the draft vocabulary's target ids, ascending (LongTensor [draft_vocab_size])."""
        super().__init__()
        self.c = c
        h = c["hidden_size"]
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(h, c["rms_norm_eps"])
        self.fc = nn.Linear(len(AUX) * c["target_hidden_size"], h, bias=False)
        self.lm_head = nn.Linear(h, c["draft_vocab_size"], bias=False)
        draft_vocab = torch.as_tensor(draft_vocab, dtype=torch.int64)
        assert draft_vocab.numel() == c["draft_vocab_size"] and bool((draft_vocab[1:] > draft_vocab[:-1]).all())
        t2d = torch.zeros(c["vocab_size"], dtype=torch.bool)
        t2d[draft_vocab] = True
        self.register_buffer("d2t", draft_vocab - torch.arange(draft_vocab.numel()))
        self.register_buffer("t2d", t2d)

    def draft_ids(self):
        """Target id of each draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def qkv(self, g, e, pos):
        L, c = self.midlayer, self.c
        x = torch.cat([L.input_layernorm(e), L.hidden_norm(g)], -1)
        b, n, _ = x.shape
        d = c["head_dim"]
        q = L.self_attn.q_proj(x).view(b, n, c["num_attention_heads"], d).transpose(1, 2)
        k = L.self_attn.k_proj(x).view(b, n, c["num_key_value_heads"], d).transpose(1, 2)
        v = L.self_attn.v_proj(x).view(b, n, c["num_key_value_heads"], d).transpose(1, 2)
        return rope(q, pos, c["rope_theta"]), rope(k, pos, c["rope_theta"]), v

    def finish(self, g, q, k, v, mask):
        L = self.midlayer
        b, _, n, _ = q.shape
        a = attend(q, k, v, mask).transpose(1, 2).reshape(b, n, -1)
        r = L.self_attn.o_proj(a) + g
        return L.mlp(L.post_attention_layernorm(r)) + r

    def logits(self, prenorm):
        """Draft-vocabulary logits."""
        return self.lm_head(self.norm(prenorm))

    def to_target(self, draft_logits):
        """Draft-vocabulary logits -> target-vocabulary logits (-inf outside the draft vocabulary)."""
        out = draft_logits.new_full(draft_logits.shape[:-1] + (self.c["vocab_size"],), float("-inf"))
        out[..., self.draft_ids()] = draft_logits
        return out

    def ttt(self, feats, emb, steps):
        """feats [B, N, 3 * target_hidden] (feat(p)), emb [B, N, H] (embedding of t_{p+1}).
        Returns the prenorm outputs [B, N, H] of steps 0..steps-1 (see the module docstring)."""
        b, n, _ = feats.shape
        pos = torch.arange(n, device=feats.device)[None].expand(b, n)
        g = self.fc(feats)
        ks, vs, outs = [], [], []
        for s in range(steps):
            if s:
                g = F.pad(outs[-1][:, :-1], (0, 0, 1, 0))  # g[:, p] = prenorm_{s-1}[:, p-1]; row 0 unused
            q, k, v = self.qkv(g, emb, pos)
            ks.append(k)
            vs.append(v)
            outs.append(self.finish(g, q, torch.cat(ks, 2), torch.cat(vs, 2), ttt_mask(n, s, feats.device)))
        return outs

    def chain(self, feats, emb, p0, k, embed, pick):
        """Inference-style drafting. feats/emb: target-fed rows at positions 0..M-1 (emb = embedding
        of t_{p+1}); p0 [B]: the chain root (last accepted position) per row, <= M-1; embed: the
        target's embedding module; pick(draft_logits [B, Vd]) -> chosen draft ids [B].
        Returns (draft tokens as target ids [B, k], draft logits [B, k, Vd])."""
        b, m, _ = feats.shape
        dev = feats.device
        rows = torch.arange(b, device=dev)
        pos = torch.arange(m, device=dev)[None].expand(b, m)
        g = self.fc(feats)
        q, k0, v0 = self.qkv(g, emb, pos)
        pre = self.finish(g, q, k0, v0, ttt_mask(m, 0, dev))[rows, p0][:, None]  # step 1 = row p0
        ks, vs = [k0], [v0]
        masks = [torch.arange(m, device=dev)[None] <= p0[:, None]]
        ids = self.draft_ids()
        tokens, all_logits = [], []
        for s in range(k):
            if s:
                e = embed(tokens[-1])[:, None].to(pre.dtype)
                qs, kk, vv = self.qkv(pre, e, (p0 + s)[:, None])
                ks.append(kk)
                vs.append(vv)
                masks.append(torch.ones(b, 1, dtype=torch.bool, device=dev))
                pre = self.finish(pre, qs, torch.cat(ks, 2), torch.cat(vs, 2), torch.cat(masks, 1)[:, None, None])
            dl = self.logits(pre)[:, 0]
            all_logits.append(dl)
            tokens.append(ids[pick(dl)])
        return torch.stack(tokens, 1), torch.stack(all_logits, 1)


def draft_vocab_from_counts(counts, size):
    """The `size` most frequent ids (ties: lower id first), ascending."""
    order = np.argsort(-np.asarray(counts, dtype=np.int64), kind="stable")[:size]
    return np.sort(order)


def init_from_target(head, target):
    """Linear layers N(0, 0.02), norms 1, lm_head = the target's (tied) embedding rows of the draft
    vocabulary and the final norm = the target's final norm, so that the head starts as the
    target's own output layer over the draft vocabulary."""
    gen = torch.Generator().manual_seed(TRAIN["eagle3"]["seed"])
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            else:
                p.fill_(1.0)
        ids = head.draft_ids().to(target.model.embed_tokens.weight.device)
        head.lm_head.weight.copy_(target.model.embed_tokens.weight[ids].float().cpu())
        head.norm.weight.copy_(target.model.norm.weight.float().cpu())


def widen_draft_vocab(head, vocab, target):
    """A head over the draft vocabulary `vocab` (target ids, ascending) with `head`'s layers: the
    lm_head rows of ids `head` drafts are its own, the others the target's (tied) embedding rows,
    as init_from_target starts a new head."""
    wide = Eagle3Head(torch.as_tensor(vocab))
    with torch.no_grad():
        own = {k: v for k, v in head.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
        wide.load_state_dict(own, strict=False)
        ids = wide.draft_ids().to(target.model.embed_tokens.weight.device)
        wide.lm_head.weight.copy_(target.model.embed_tokens.weight[ids].float().cpu())
        row_of = torch.full((head.c["vocab_size"],), -1, dtype=torch.int64)
        row_of[wide.draft_ids()] = torch.arange(wide.d2t.numel())
        rows = row_of[head.draft_ids()]
        assert bool((rows >= 0).all()), "the wider vocabulary must hold every id the head drafts"
        wide.lm_head.weight[rows] = head.lm_head.weight.float()
    return wide


# ---------------------------------------------------------------------------------------------
# Target side


def target_forward(target, ids):
    """(feat [B, T, 3 * hidden], logits [B, T, V]) of the target over ids."""
    out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    n = target.config.num_hidden_layers
    assert len(hs) == n + 1, f"expected {n + 1} hidden states, got {len(hs)}"
    return torch.cat([hs[i] for i in AUX], -1), out.logits


@torch.no_grad()
def check_aux_semantics(target, ids):
    """hidden_states[i] must be the input of decoder layer i (what the engine reads): checked with
    forward pre-hooks on the layers themselves."""
    seen = {}

    def hook(i):
        def fn(module, args, kwargs):
            seen[i] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return fn

    handles = []
    for i in AUX:
        layer = target.model.layers[i]
        try:
            handles.append(layer.register_forward_pre_hook(hook(i), with_kwargs=True))
        except TypeError:  # torch < 2.0 (local CPU checks): positional arguments only
            handles.append(layer.register_forward_pre_hook(lambda m, a, fn=hook(i): fn(m, a, {})))
    try:
        hs = target(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    finally:
        for h in handles:
            h.remove()
    diffs = {str(i): (hs[i].float() - seen[i].float()).abs().max().item() for i in AUX}
    assert all(d == 0.0 for d in diffs.values()), f"hidden_states[i] is not the input of layer i: {diffs}"
    return {"hidden_states_i_equals_input_of_layer_i": True, "max_abs_diff": diffs}


# ---------------------------------------------------------------------------------------------
# Saving and loading


def save_eagle3(head, folder):
    from safetensors.torch import save_file

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    tensors = {}
    for k, v in head.state_dict().items():
        v = v.detach().cpu()
        tensors[k] = (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
    dtypes = {torch.bfloat16: "BF16", torch.int64: "I64", torch.bool: "BOOL"}
    got = {k: (list(v.shape), dtypes.get(v.dtype, str(v.dtype))) for k, v in tensors.items()}
    want = expected_tensors()
    assert got == want, f"checkpoint layout differs: {sorted(set(got.items()) ^ set(want.items()), key=str)[:6]}"
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(checkpoint_config(), f, indent=2)
        f.write("\n")
    return {n: os.path.getsize(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}


def load_eagle3(folder, dtype=torch.float32, dev="cpu", any_draft_vocab=False):
    """any_draft_vocab: accept a draft vocabulary of another size than EAGLE3's (an earlier head that
    widen_draft_vocab carries over)."""
    from safetensors.torch import load_file

    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    want = checkpoint_config()
    if any_draft_vocab:
        want["draft_vocab_size"] = cfg.get("draft_vocab_size")
    diff = {k: (cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v}
    assert not diff, f"{folder}/config.json differs from the expected EAGLE-3 config: {diff}"
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    assert sorted(tensors) == sorted(expected_tensors()), f"{folder}: tensor names {sorted(tensors)}"
    d2t = tensors["d2t"].long()
    head = Eagle3Head(torch.arange(d2t.numel()) + d2t, dict(EAGLE3, draft_vocab_size=d2t.numel()))
    assert torch.equal(head.t2d, tensors["t2d"].bool()), "t2d disagrees with d2t"
    head.load_state_dict({k: (v.to(dtype) if v.is_floating_point() else v) for k, v in tensors.items()}, strict=True)
    return head.to(dtype).to(dev).eval()


def _bf16_rounded(head):
    import copy

    out = copy.deepcopy(head).float().eval()
    with torch.no_grad():
        for p in out.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return out


@torch.no_grad()
def verify(head, folder, feats, emb):
    """Reloads the folder and compares every TTT step's logits with the in-memory head rounded to bf16."""
    from common import exact_fp32

    exact_fp32()
    dev = feats.device
    loaded = load_eagle3(folder, torch.float32, dev)
    ref = _bf16_rounded(head).to(dev)
    feats, emb = feats.float(), emb.float()
    report = {}
    for s, (a, b) in enumerate(zip(ref.ttt(feats, emb, EAGLE3_TTT_STEPS), loaded.ttt(feats, emb, EAGLE3_TTT_STEPS))):
        la, lb = ref.logits(a), loaded.logits(b)
        d = (la - lb).abs()
        report[f"step_{s}"] = {"max_abs_diff": d.max().item(),
                               "argmax_agreement": (la.argmax(-1) == lb.argmax(-1)).float().mean().item()}
    worst = max(r["max_abs_diff"] for r in report.values())
    assert worst < 1e-3, f"reloaded head differs: {report}"
    return report


# ---------------------------------------------------------------------------------------------
# Training


def soft_targets(head, target_logits):
    """The target's next-token distribution restricted to the draft vocabulary and renormalised,
    its argmax (target id) and whether that argmax is in the draft vocabulary."""
    tl = target_logits.float()
    probs = torch.softmax(tl[..., head.draft_ids()], -1)
    arg = tl.argmax(-1)
    return probs, arg, head.t2d[arg]


def ttt_losses(head, feats, emb, target_logits, steps, mask_oov=EAGLE3_MASK_OUT_OF_VOCAB):
    """feats/emb/target_logits: row p = position p; target_logits[:, p] is the target's
    distribution at p+1 (the label of row p). Returns (total loss, {name: value})."""
    with torch.no_grad():
        probs, arg, in_vocab = soft_targets(head, target_logits)
        keep = in_vocab if mask_oov else torch.ones_like(in_vocab)
    ids = head.draft_ids()
    total, parts = 0.0, {}
    for s, pre in enumerate(head.ttt(feats, emb, steps)):
        logits = head.logits(pre).float()
        valid = keep.clone()
        valid[:, :s] = False
        n = valid.sum().clamp(min=1)
        loss_s = (-(probs * F.log_softmax(logits, -1)).sum(-1) * valid).sum() / n
        total = total + EAGLE3_STEP_DECAY ** s * loss_s
        parts[f"loss_{s}"] = loss_s.detach()
        with torch.no_grad():
            parts[f"agree_{s}"] = ((ids[logits.argmax(-1)] == arg) & valid).sum() / n
    return total, parts


def train_eagle3(data_dir, out_dir, results_path, target_dir, dry=False, init_from=None):
    """init_from: a saved head to go on training (its draft vocabulary kept) instead of a new one;
    the earlier run's figures (results_path, read before it is rewritten) go into `earlier_runs`."""
    from common import count_params, device, fast_training, load_hf, log, write_json
    from data import Stream
    from train import run_loop, unique_trainable

    fast_training()
    tc = TRAIN["eagle3-continue" if init_from else "eagle3"]
    dev = device()
    counts = np.bincount(np.load(os.path.join(data_dir, "train.npy")).astype(np.int64),
                         minlength=EAGLE3["vocab_size"])[:EAGLE3["vocab_size"]]
    earlier, head = [], None
    if init_from:
        with open(results_path) as f:
            before = json.load(f)
        earlier = before.get("earlier_runs", []) + [
            {k: before[k] for k in ("steps", "tokens", "seconds", "ms_per_step", "peak_lr", "seed", "history") if k in before}]
        head = load_eagle3(init_from, any_draft_vocab=True)
        log(f"eagle3: going on from {init_from} ({len(earlier)} earlier runs)")
    vocab = draft_vocab_from_counts(counts, EAGLE3["draft_vocab_size"])
    if head is not None and head.d2t.numel() == vocab.size:
        vocab = head.draft_ids().numpy()
    if init_from:
        # Each continuation draws new data windows: the second run seeds with tc["seed"], the third
        # with tc["seed"] + 1, ... (so the seed waits for `earlier`).
        tc = dict(tc, seed=tc["seed"] + len(earlier) - 1)
    torch.manual_seed(tc["seed"])
    coverage = float(counts[vocab].sum() / counts.sum())
    log(f"eagle3: draft vocabulary of {vocab.size} ids covers {coverage:.4f} of the training tokens")
    stream = Stream(os.path.join(data_dir, "train.npy"), dev)
    target, _ = load_hf(target_dir, torch.bfloat16, "sdpa", dev)
    target.requires_grad_(False)
    embed = target.model.embed_tokens
    if head is None:
        head = Eagle3Head(torch.from_numpy(vocab))
        init_from_target(head, target)
    elif head.d2t.numel() != vocab.size:
        log(f"eagle3: draft vocabulary widened from {head.d2t.numel()} to {vocab.size} ids")
        head = widen_draft_vocab(head, torch.from_numpy(vocab), target)
    head = head.to(dev).train()
    gen = torch.Generator(device=dev).manual_seed(99)
    semantics = check_aux_semantics(target, stream.random_batch(2, gen)[:, :64])
    log(f"eagle3: {semantics}")

    def loss_fn(batch):
        # batch [B, SEQ_LEN + 1]: the target runs over all of it; head rows p = 0..SEQ_LEN-1 read
        # feat(p) and t_{p+1} and are labelled by the target's distribution at p+1.
        with torch.no_grad():
            feats, logits = target_forward(target, batch)
            emb = embed(batch[:, 1:])
        return ttt_losses(head, feats[:, :-1].float(), emb.float(), logits[:, 1:], EAGLE3_TTT_STEPS)

    summary = run_loop("eagle3", unique_trainable(head), loss_fn, stream, tc, dry)
    head.eval()
    summary.update(model=NAMES["eagle3"], target=target_dir, parameters=count_params(head),
                   ttt_steps=EAGLE3_TTT_STEPS, step_decay=EAGLE3_STEP_DECAY,
                   mask_out_of_vocab=EAGLE3_MASK_OUT_OF_VOCAB, aux_layers=list(AUX),
                   draft_vocab_size=int(vocab.size), draft_vocab_train_coverage=coverage,
                   aux_semantics=semantics, weight_decay=tc["weight_decay"], seed=tc["seed"])
    if init_from:
        summary.update(init_from=init_from, earlier_runs=earlier,
                       total_tokens=summary["tokens"] + sum(r["tokens"] for r in earlier))
    summary["file_sizes"] = save_eagle3(head, out_dir)
    log(f"eagle3: saved {out_dir} {summary['file_sizes']}")
    sample = Stream(os.path.join(data_dir, "val.npy"), dev).random_batch(4, gen)
    with torch.no_grad():
        feats, _ = target_forward(target, sample)
        summary["verify"] = verify(head, out_dir, feats[:, :-1], embed(sample[:, 1:]))
    log(f"eagle3: verify {summary['verify']}")
    write_json(results_path, summary)
    log(f"eagle3: results {results_path}")


# ---------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def teacher_forced(head, target, windows, steps, batch=16):
    """On validation windows: per TTT step (= draft depth s + 1 with teacher-forced chain tokens),
    top-1 agreement with the target's argmax, accuracy against the text, soft loss and expected
    acceptance at temperature 1 (sum_x min(p(x), q(x)), q zero outside the draft vocabulary);
    plus the draft vocabulary's coverage of the text and of the target's argmax."""
    ids = head.draft_ids()
    embed = target.model.embed_tokens
    sums = [dict(agree=0.0, text=0.0, loss=0.0, accept=0.0, rows=0) for _ in range(steps)]
    cover_text = cover_arg = n_all = 0.0
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        feats, tl = target_forward(target, w)
        feats, tl = feats[:, :-1], tl[:, 1:].float()
        p_full = torch.softmax(tl, -1)
        arg = tl.argmax(-1)
        nxt = w[:, 2:]  # t_{p+2} for rows p = 0..T-2
        cover_text += head.t2d[w[:, 1:]].sum().item()
        cover_arg += head.t2d[arg].sum().item()
        n_all += arg.numel()
        for s, pre in enumerate(head.ttt(feats, embed(w[:, 1:]), steps)):
            dl = head.logits(pre).float()
            q = torch.softmax(dl, -1)
            pick = ids[dl.argmax(-1)]
            r = slice(s, None)
            st = sums[s]
            st["agree"] += (pick == arg)[:, r].sum().item()
            st["text"] += (pick[:, :-1] == nxt)[:, s:].sum().item()
            st["loss"] += (-(torch.softmax(tl[..., ids], -1) * F.log_softmax(dl, -1)).sum(-1))[:, r].sum().item()
            st["accept"] += torch.minimum(p_full[..., ids], q).sum(-1)[:, r].sum().item()
            st["rows"] += pick[:, r].numel()
    per_step = []
    for s, st in enumerate(sums):
        n = st["rows"]
        text_rows = n - windows.shape[0]  # the last row of each window has no t_{p+2}
        per_step.append({"step": s, "draft_depth": s + 1, "rows": n,
                         "top1_agreement_with_target_argmax": st["agree"] / n,
                         "top1_accuracy_on_text": st["text"] / text_rows,
                         "soft_cross_entropy": st["loss"] / n,
                         "expected_acceptance_t1": st["accept"] / n})
    return {"per_step": per_step, "draft_vocab_coverage_of_text": cover_text / n_all,
            "draft_vocab_coverage_of_target_argmax": cover_arg / n_all}


@torch.no_grad()
def chain_accept_lengths(head, target, seq, prompt_len, steps):
    """On the target's greedy sequence seq [B, P + G]: for each chain root c = P-1 .. P+G-2 (the
    last token known when drafting token c+1), how many of the head's greedy drafts d1..d_steps
    equal the target's tokens c+1, c+2, ... (leading run). A TTT pass with teacher-forced tokens
    gives exactly the greedy chains: while drafts are right, they are the target's tokens."""
    feats, _ = target_forward(target, seq[:, :-1])
    emb = target.model.embed_tokens(seq[:, 1:])
    ids = head.draft_ids()
    b, t = seq.shape
    n = t - 1  # rows p = 0..T-2
    match = torch.zeros(steps, b, n, dtype=torch.bool, device=seq.device)
    for s, pre in enumerate(head.ttt(feats, emb, steps)):
        pred = ids[head.logits(pre).argmax(-1)]  # row p predicts t_{p+2}
        match[s, :, :n - 1] = pred[:, :n - 1] == seq[:, 2:]
    roots = torch.arange(prompt_len - 1, t - 1, device=seq.device)  # c
    run = torch.ones(b, roots.numel(), dtype=torch.long, device=seq.device)
    length = torch.zeros_like(run)
    for s in range(steps):
        p = (roots - 1 + s).clamp(max=n - 1)
        ok = match[s][:, p] & (roots - 1 + s <= n - 1)
        run = run * ok.long()
        length += run
    return length  # [B, G]


def tokens_per_step_from_lengths(lengths, k):
    """Mirror of evaluate.tokens_per_step for chains: at region offset j the accepted drafts are
    min(k, lengths[j], G - j), and the target adds one token."""
    steps = tokens = 0
    for row in lengths.tolist():
        g, j = len(row), 0
        while j < g:
            a = min(k, row[j], g - j)
            steps += 1
            tokens += a + 1
            j += a + 1
    return tokens / steps


def draft_proposer(draft):
    def propose(seq, n, k, sample, gen):
        rows = torch.arange(seq.shape[0], device=seq.device)
        x = seq.clone()
        toks, qs = [], []
        for j in range(k):
            logits = draft(input_ids=x[:, :int(n.max()) + j], use_cache=False).logits[rows, n - 1 + j].float()
            q = torch.softmax(logits, -1)
            d = torch.multinomial(q, 1, generator=gen)[:, 0] if sample else logits.argmax(-1)
            x[rows, n + j] = d
            toks.append(d)
            qs.append(q)
        return torch.stack(toks, 1), torch.stack(qs, 1)
    return propose


def eagle_proposer(head, target):
    embed = target.model.embed_tokens
    ids = head.draft_ids()
    vocab = head.c["vocab_size"]

    def propose(seq, n, k, sample, gen):
        # The target's features of rows 0..n-2 (in the engine: from its last verification pass),
        # the head's target-fed rows over them, then the chain from p0 = n - 2 (token t_{n-1}).
        m = int(n.max()) - 1
        feats, _ = target_forward(target, seq[:, :m])
        emb = embed(seq[:, 1:m + 1])

        def pick(dl):
            if not sample:
                return dl.argmax(-1)
            return torch.multinomial(torch.softmax(dl.float(), -1), 1, generator=gen)[:, 0]

        toks, dl = head.chain(feats, emb, n - 2, k, embed, pick)
        q = torch.zeros(dl.shape[0], k, vocab, device=dl.device)
        q[..., ids] = torch.softmax(dl.float(), -1)
        return toks, q
    return propose


@torch.no_grad()
def replay(target, propose, prompts, k, n_new, sample, gen):
    """Speculative decoding replayed on the target, batched over prompts: each round drafts k
    tokens, one target forward verifies them. Greedy: a draft is accepted while it equals the
    target's argmax, then the target's argmax is added. Sampling at temperature 1 (standard
    speculative sampling, a Monte-Carlo replay): draft j is accepted with probability
    min(1, p(d_j) / q(d_j)); on rejection a token is drawn from norm(max(p - q, 0)), after k
    acceptances from p. Drafts counted only while inside the n_new tokens (as
    evaluate.tokens_per_step does). Returns tokens per target forward and the acceptance rate."""
    b, plen = prompts.shape
    dev = prompts.device
    rows = torch.arange(b, device=dev)
    seq = torch.zeros(b, plen + n_new + k + 2, dtype=torch.long, device=dev)
    seq[:, :plen] = prompts
    n = torch.full((b,), plen, dtype=torch.long, device=dev)
    produced = torch.zeros_like(n)
    forwards = torch.zeros_like(n)
    accepted = torch.zeros_like(n)
    ar_k = torch.arange(k, device=dev)
    ar_k1 = torch.arange(k + 1, device=dev)
    while bool((produced < n_new).any()):
        active = produced < n_new
        drafts, q = propose(seq, n, k, sample, gen)
        x = seq[:, :int(n.max()) + k].clone()
        x.scatter_(1, n[:, None] + ar_k, drafts)
        logits = target(input_ids=x, use_cache=False).logits.float()
        v = logits.shape[-1]
        tl = logits.gather(1, (n[:, None] - 1 + ar_k1)[..., None].expand(-1, -1, v))  # [B, k+1, V]
        if sample:
            p = torch.softmax(tl, -1)
            pd = p[:, :k].gather(-1, drafts[..., None])[..., 0]
            qd = q.gather(-1, drafts[..., None])[..., 0]
            ok = torch.rand(b, k, generator=gen, device=dev) * qd < pd
        else:
            ok = drafts == tl[:, :k].argmax(-1)
        ok &= ar_k[None] < (n_new - produced)[:, None]
        a = ok.long().cumprod(1).sum(1)
        if sample:
            pa = p[rows, a]
            qa = torch.cat([q, torch.zeros_like(q[:, :1])], 1)[rows, a]
            resid = (pa - qa).clamp(min=0)
            z = resid.sum(-1, keepdim=True)
            resid = torch.where(z > 0, resid / z.clamp(min=1e-30), pa)
            nxt = torch.multinomial(resid, 1, generator=gen)[:, 0]
        else:
            nxt = tl.argmax(-1)[rows, a]
        new = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], 1)
        new[rows, a] = nxt
        cols = n[:, None] + ar_k1
        write = (ar_k1[None] <= a[:, None]) & active[:, None]
        seq.scatter_(1, cols, torch.where(write, new, seq.gather(1, cols)))
        step = (a + 1) * active
        n += step
        produced += step
        forwards += active.long()
        accepted += a * active
    counts = {"target_forwards": int(forwards.sum().item()), "tokens": int(produced.sum().item()),
              "accepted_drafts": int(accepted.sum().item())}
    return replay_figures(counts, k), seq[:, plen:plen + n_new]


def replay_figures(counts, k):
    return dict(counts, tokens_per_target_forward=counts["tokens"] / counts["target_forwards"],
                draft_acceptance_rate=counts["accepted_drafts"] / (k * counts["target_forwards"]))


T1_REPEATS = 2  # Monte-Carlo runs of the temperature-1 replay per k and proposer


@torch.no_grad()
def evaluate_eagle3(models_root, data_dir, results_path, dry=False):
    from common import device, exact_fp32, load_hf, log, read_json, write_json
    from data import Stream, load_meta
    from evaluate import GEN_NEW, GEN_PROMPT_LEN, GEN_PROMPTS, greedy_continue, tokens_per_step

    exact_fp32()
    dev = device()
    stream = Stream(os.path.join(data_dir, "val.npy"), dev)
    windows = stream.fixed_windows(16 if dry else 64)
    prompts = stream.fixed_windows(4 if dry else GEN_PROMPTS, GEN_PROMPT_LEN)[:, :GEN_PROMPT_LEN]
    target, _ = load_hf(os.path.join(models_root, NAMES["tiny"]), torch.float32, "sdpa", dev)
    draft, _ = load_hf(os.path.join(models_root, NAMES["draft"]), torch.float32, "sdpa", dev)
    head = load_eagle3(os.path.join(models_root, NAMES["eagle3"]), torch.float32, dev)
    res = {"model": NAMES["eagle3"], "target": NAMES["tiny"], "compared_with": NAMES["draft"],
           "aux_layers": list(AUX), "aux_semantics": check_aux_semantics(target, windows[:2, :64]),
           "data": {k: v for k, v in load_meta(data_dir).items() if k != "roots"}}

    tf = teacher_forced(head, target, windows, EAGLE3_TTT_STEPS)
    tf["val_windows"] = windows.shape[0]
    res["teacher_forced_on_validation_text"] = tf
    res["step0_top1_agreement_with_target_argmax"] = tf["per_step"][0]["top1_agreement_with_target_argmax"]
    log(f"eval eagle3 teacher-forced: {tf}")

    seq = greedy_continue(target, prompts, GEN_NEW)
    gen_tokens = seq[:, GEN_PROMPT_LEN:]
    res["draft_vocab_coverage_of_target_greedy_tokens"] = head.t2d[gen_tokens].float().mean().item()
    lengths = chain_accept_lengths(head, target, seq, GEN_PROMPT_LEN, EAGLE3_TTT_STEPS)
    d_next = draft(input_ids=seq[:, :-1], use_cache=False).logits.argmax(-1)
    match = (d_next == seq[:, 1:])[:, GEN_PROMPT_LEN - 1:]
    ks = range(1, EAGLE3_TTT_STEPS + 1)
    greedy = {"prompts": prompts.shape[0], "new_tokens": GEN_NEW,
              "eagle3_tokens_per_target_forward": {str(k): round(tokens_per_step_from_lengths(lengths, k), 3)
                                                   for k in ks},
              "draft_tokens_per_target_forward": {str(k): round(tokens_per_step(match, k), 3) for k in ks},
              "eagle3_acceptance_by_depth": [((lengths > s).float().sum() / (lengths >= s).float().sum()).item()
                                             for s in range(EAGLE3_TTT_STEPS)],
              "draft_greedy_acceptance_per_token": match.float().mean().item()}
    log(f"eval eagle3 greedy (on the target's greedy continuations): {greedy}")

    # The same figures from an actual drafting loop (chained head with its own K/V, draft model
    # drafting autoregressively), greedy (a check: must match the above) and sampled at T = 1.
    loops = {"greedy": {}, "temperature_1": {}}
    gen = torch.Generator(device=dev).manual_seed(1234)
    same_text = True
    for k in ks:
        for name, prop in (("eagle3", eagle_proposer(head, target)), ("draft", draft_proposer(draft))):
            r, text = replay(target, prop, prompts, k, GEN_NEW, False, gen)
            same_text &= bool(torch.equal(text, gen_tokens))
            loops["greedy"].setdefault(name, {})[str(k)] = r
            total = {}
            for _ in range(T1_REPEATS):
                r, _ = replay(target, prop, prompts, k, GEN_NEW, True, gen)
                for c in ("target_forwards", "tokens", "accepted_drafts"):
                    total[c] = total.get(c, 0) + r[c]
            loops["temperature_1"].setdefault(name, {})[str(k)] = replay_figures(total, k)
        log(f"eval eagle3 replay k={k}: " + str({m: {n: loops[m][n][str(k)]["tokens_per_target_forward"]
                                                     for n in loops[m]} for m in loops}))
    loops["greedy_replay_reproduced_target_greedy_text"] = same_text
    loops["note"] = ("temperature_1: Monte-Carlo replay of speculative sampling (drafts sampled from q, "
                     f"accepted with min(1, p/q), residual / bonus tokens sampled), {T1_REPEATS} runs per k "
                     "added up, one generator seeded 1234")
    res["replay"] = loops
    summary = {"tokens_per_target_forward_greedy": {
        "eagle3": {k: v["tokens_per_target_forward"] for k, v in loops["greedy"]["eagle3"].items()},
        "draft": {k: v["tokens_per_target_forward"] for k, v in loops["greedy"]["draft"].items()}},
        "tokens_per_target_forward_t1_monte_carlo": {
        "eagle3": {k: v["tokens_per_target_forward"] for k, v in loops["temperature_1"]["eagle3"].items()},
        "draft": {k: v["tokens_per_target_forward"] for k, v in loops["temperature_1"]["draft"].items()}}}
    res["summary"] = summary
    res["greedy_from_acceptance_lengths"] = greedy
    log(f"eval eagle3 summary: {summary}")
    train_path = results_path.replace(".eval.json", ".train.json")
    if os.path.exists(train_path):
        res["training"] = {k: v for k, v in read_json(train_path).items() if k not in ("history", "verify")}
    write_json(results_path, res)
    return res


# ---------------------------------------------------------------------------------------------
# Fixture

FIXTURE_PROMPT_LEN = 24
FIXTURE_CHAIN = 4
FIXTURE_TOPK = 5


def fixture_prompts(val):
    """Two windows of the validation stream, each starting a document: the stream's first tokens
    and the tokens after its 5th <|endoftext|>."""
    ends = np.flatnonzero(val == ENDOFTEXT_ID)
    starts = [0, int(ends[4]) + 1 if ends.size > 4 else 1000]
    return [[int(t) for t in val[s:s + FIXTURE_PROMPT_LEN]] for s in starts]


@torch.no_grad()
def make_fixture(models_root, out_root, data_dir):
    """tests/fixtures/embedded/specula-tiny-eagle3/reference.safetensors, per prompt i (T tokens):
      prompt_i             I32 [T]      token ids (from the validation stream)
      next_token_i         I32 [1]      the target's greedy token after the prompt (t_T; the input
                                        token of row T-1)
      target_greedy_i      I32 [5]      the target's greedy continuation t_T .. t_{T+4}
      fc_out_i             F32 [T, H]   g = fc(feat(p)) of the target-fed rows
      step0_top5_ids_i     I32 [T, 5]   per target-fed row p (token t_{p+1}, position p): the top-5
      step0_top5_logits_i  F32 [T, 5]   draft logits, as target ids (they predict t_{p+2})
      chain_tokens_i       I32 [4]      greedy chain from p0 = T-1: d1 (row T-1) .. d4
      chain_pos_i          I32 [4]      the RoPE positions of those rows (T-1 .. T+2)
      chain_top5_ids_i     I32 [4, 5]   top-5 target ids and logits of each chain step
      chain_top5_logits_i  F32 [4, 5]
    Computed on the CPU in fp32 from the shipped bf16 weights; target features from transformers
    (eager attention)."""
    from safetensors.torch import save_file

    from common import load_hf, log

    torch.set_num_threads(min(16, os.cpu_count() or 1))
    target, _ = load_hf(os.path.join(models_root, NAMES["tiny"]), torch.float32, "eager", "cpu")
    head = load_eagle3(os.path.join(models_root, NAMES["eagle3"]), torch.float32, "cpu")
    val = np.load(os.path.join(data_dir, "val.npy")).astype(np.int64)
    prompts = fixture_prompts(val)
    embed = target.model.embed_tokens
    ids = head.draft_ids()
    tensors, margins, margins0, meta = {}, [], [], {}
    for i, prompt in enumerate(prompts):
        t = len(prompt)
        seq = list(prompt)
        for _ in range(FIXTURE_CHAIN + 1):
            seq.append(int(target(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
        greedy = seq[t:]
        x = torch.tensor([prompt])
        feats, _ = target_forward(target, x)
        emb = embed(torch.tensor([prompt[1:] + [greedy[0]]]))
        dl0 = head.logits(head.ttt(feats, emb, 1)[0])[0]
        top0 = dl0.topk(FIXTURE_TOPK, -1)
        toks, dls = head.chain(feats, emb, torch.tensor([t - 1]), FIXTURE_CHAIN, embed, lambda d: d.argmax(-1))
        topc = dls[0].topk(FIXTURE_TOPK, -1)
        assert torch.allclose(dls[0, 0], dl0[t - 1], atol=1e-4), "chain step 1 must be the target-fed row at p0"
        margins.append(float((topc.values[:, 0] - topc.values[:, 1]).min()))
        margins0.append(float((top0.values[:, 0] - top0.values[:, 1]).min()))
        tensors.update({
            f"prompt_{i}": torch.tensor(prompt, dtype=torch.int32),
            f"next_token_{i}": torch.tensor([greedy[0]], dtype=torch.int32),
            f"target_greedy_{i}": torch.tensor(greedy, dtype=torch.int32),
            f"fc_out_{i}": head.fc(feats)[0].contiguous(),
            f"step0_top5_ids_{i}": ids[top0.indices].to(torch.int32).contiguous(),
            f"step0_top5_logits_{i}": top0.values.contiguous(),
            f"chain_tokens_{i}": toks[0].to(torch.int32).contiguous(),
            f"chain_pos_{i}": torch.arange(t - 1, t - 1 + FIXTURE_CHAIN, dtype=torch.int32),
            f"chain_top5_ids_{i}": ids[topc.indices].to(torch.int32).contiguous(),
            f"chain_top5_logits_{i}": topc.values.contiguous()})
        meta[f"prompt_{i}_accepted_greedy"] = str(int(torch.tensor(
            [a == b for a, b in zip(toks[0].tolist(), greedy[1:])]).long().cumprod(0).sum()))
        log(f"fixture eagle3 prompt {i}: chain {toks[0].tolist()} target greedy {greedy[1:]}")
    import transformers

    out_dir = os.path.join(out_root, NAMES["eagle3"])
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "reference.safetensors")
    save_file(tensors, path, metadata=dict(meta, **{
        "generator": f"transformers {transformers.__version__}, torch {torch.__version__}, fp32, CPU",
        "model": NAMES["eagle3"], "target": NAMES["tiny"], "aux_layers": ",".join(map(str, AUX)),
        "min_chain_top1_margin": f"{min(margins):.4f}", "min_step0_top1_margin": f"{min(margins0):.4f}",
        "layout": "see make_fixture in tools/train/eagle3.py"}))
    log(f"fixture eagle3: {path} ({os.path.getsize(path)} bytes), min chain top-1 margin {min(margins):.4f}")

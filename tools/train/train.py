"""Training of the three models through transformers' own model classes.

  tiny   Qwen3ForCausalLM, next-token cross-entropy.
  draft  Qwen3ForCausalLM, distilled from the saved specula-tiny: KL(p_target || q_draft) per token
         at temperature 1 (the draft learns the target's whole distribution, which is what both
         greedy and lossless-sampling acceptance depend on).
  moe    DeepseekV3ForCausalLM + one MTP layer: L_main + lambda * L_MTP, with aux-loss-free
         balancing of the routed experts in the main model and the MTP block.

All: AdamW (betas 0.9/0.95, weight decay on matrices only), linear warmup then cosine to a tenth of
the peak rate, bf16 autocast over fp32 master weights, gradient clipping at 1.0, random windows of
SEQ_LEN + 1 tokens. Weights are saved in bf16 with save_pretrained and verified by reloading.
"""
import math
import os
import time

import torch
import torch.nn.functional as F

from common import count_params, device, fast_training, log, write_json
from configs import (BIAS_UPDATE_SPEED, DRAFT, DRY_RUN_STEPS, MOE, MOE_EXTRA_CONFIG, MTP_LOSS_WEIGHT, NAMES,
                     TINY, TRAIN, VOCAB_SIZE)
from data import Stream


def new_model(kind, attn="sdpa"):
    import transformers
    from transformers import AutoModelForCausalLM

    cls, kw = {"tiny": ("Qwen3Config", TINY), "draft": ("Qwen3Config", DRAFT),
               "moe": ("DeepseekV3Config", MOE)}[kind]
    cfg = getattr(transformers, cls)(**kw)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied, f"{kind}: transformers did not tie lm_head to embed_tokens"
    return model


def make_optimizer(params, tc):
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tc["weight_decay"]},
                              {"params": other, "weight_decay": 0.0}],
                             lr=tc["lr"], betas=(0.9, 0.95), eps=1e-8, fused=torch.cuda.is_available())


def lr_scale(step, progress, warmup):
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def unique_trainable(*modules):
    seen = {}
    for m in modules:
        for p in m.parameters():
            if p.requires_grad:
                seen[id(p)] = p
    return list(seen.values())


def ce(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), targets.reshape(-1))


def run_loop(kind, params, loss_fn, stream, tc, dry, after_step=None):
    steps = DRY_RUN_STEPS if dry else tc["steps"]
    warmup = min(tc["warmup"], max(1, steps // 4))
    opt = make_optimizer(params, tc)
    gen = torch.Generator(device=stream.device).manual_seed(tc["seed"])
    history = []
    t0 = time.time()
    t_mark, step_mark = None, 0
    step = tokens = 0
    while True:
        progress = max(step / steps, (time.time() - t0) / tc["time_limit_s"])
        if progress >= 1.0:
            break
        lr = tc["lr"] * lr_scale(step, progress, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = stream.random_batch(tc["batch"], gen)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):
            loss, parts = loss_fn(batch)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if after_step:
            after_step(step, steps)
        tokens += batch.shape[0] * (batch.shape[1] - 1)
        if step == 10:
            torch.cuda.synchronize()
            t_mark, step_mark = time.time(), step
        if step % (10 if dry else 250) == 0 or step == 1:
            entry = {"step": step, "lr": round(lr, 6), "loss": round(loss.item(), 4),
                     "grad_norm": round(grad_norm.item(), 3), "seconds": round(time.time() - t0, 1)}
            entry.update({k: round(v.item(), 4) for k, v in parts.items()})
            history.append(entry)
            log(f"{kind} {entry}")
    torch.cuda.synchronize()
    seconds = time.time() - t0
    ms_per_step = 1000 * (time.time() - t_mark) / max(1, step - step_mark) if t_mark else None
    summary = {"steps": step, "planned_steps": steps, "time_limited": step < steps, "tokens": tokens,
               "seconds": round(seconds, 1), "ms_per_step": round(ms_per_step, 2) if ms_per_step else None,
               "batch": tc["batch"], "seq_len": stream.seq_len, "peak_lr": tc["lr"], "warmup": warmup,
               "history": history}
    log(f"{kind}: {step} steps, {tokens} tokens in {seconds:.0f}s ({summary['ms_per_step']} ms/step)")
    return summary


def train_tiny(stream, tc, dry):
    model = new_model("tiny").to(stream.device).train()

    def loss_fn(batch):
        loss = ce(model(input_ids=batch[:, :-1], use_cache=False).logits, batch[:, 1:])
        return loss, {}

    summary = run_loop("tiny", unique_trainable(model), loss_fn, stream, tc, dry)
    return model.eval(), None, summary


def train_draft(stream, tc, dry, teacher_dir):
    from common import load_hf

    teacher, _ = load_hf(teacher_dir, torch.bfloat16, "sdpa", stream.device)
    teacher.requires_grad_(False)
    model = new_model("draft").to(stream.device).train()

    def loss_fn(batch):
        x = batch[:, :-1]
        with torch.no_grad():
            t_logp = F.log_softmax(teacher(input_ids=x, use_cache=False).logits.float(), -1).reshape(-1, VOCAB_SIZE)
        s_logits = model(input_ids=x, use_cache=False).logits.float().reshape(-1, VOCAB_SIZE)
        kl = F.kl_div(F.log_softmax(s_logits, -1), t_logp, log_target=True, reduction="batchmean")
        with torch.no_grad():
            ce_true = F.cross_entropy(s_logits, batch[:, 1:].reshape(-1))
            agree = (s_logits.argmax(-1) == t_logp.argmax(-1)).float().mean()
        return kl, {"ce": ce_true, "agree_top1": agree}

    summary = run_loop("draft", unique_trainable(model), loss_fn, stream, tc, dry)
    summary["teacher"] = teacher_dir
    return model.eval(), None, summary


def train_moe(stream, tc, dry):
    from balance import LoadBalancer, find_routers
    from mtp import new_mtp, positions_like

    main = new_model("moe").to(stream.device).train()
    mtp = new_mtp(main, "sdpa").to(stream.device).train()
    routers = find_routers(main, "main.")
    routers.update(find_routers(mtp.lm, "mtp."))
    assert len(routers) == MOE["num_hidden_layers"] - MOE["first_k_dense_replace"] + 1, sorted(routers)
    balancer = LoadBalancer(routers, main.config, BIAS_UPDATE_SPEED)
    params = unique_trainable(main, mtp)

    def loss_fn(batch):
        x, y = batch[:, :-1], batch[:, 1:]
        h = main.model(input_ids=x, use_cache=False).last_hidden_state
        l_main = ce(main.lm_head(h), y)
        # MTP at position i sees h_i and t_{i+1} (= y_i) and predicts t_{i+2} (= batch[:, i+2]).
        mtp_logits = mtp(y, h, positions_like(x))
        l_mtp = ce(mtp_logits[:, :-1], batch[:, 2:])
        return l_main + MTP_LOSS_WEIGHT * l_mtp, {"main": l_main.detach(), "mtp": l_mtp.detach()}

    def after_step(step, steps):  # the load figures cover the last quarter of the planned steps
        balancer.update(record=step > 0.75 * steps)

    summary = run_loop("moe", params, loss_fn, stream, tc, dry, after_step=after_step)
    summary["expert_load_last_quarter"] = balancer.summary()
    summary["mtp_loss_weight"] = MTP_LOSS_WEIGHT
    summary["bias_update_speed"] = BIAS_UPDATE_SPEED
    balancer.remove()
    return main.eval(), mtp.eval(), summary


def train(kind, data_dir, out_dir, tokenizer_dir, results_path, dry=False, teacher_dir=None):
    from mtp import save_mtp
    from save import save_hf, verify

    fast_training()
    torch.manual_seed(TRAIN[kind]["seed"])
    dev = device()
    stream = Stream(os.path.join(data_dir, "train.npy"), dev)
    tc = TRAIN[kind]
    if kind == "tiny":
        model, mtp, summary = train_tiny(stream, tc, dry)
    elif kind == "draft":
        model, mtp, summary = train_draft(stream, tc, dry, teacher_dir)
    else:
        model, mtp, summary = train_moe(stream, tc, dry)
    summary["model"] = NAMES[kind]
    summary["parameters"] = count_params(model)
    extra = None
    if mtp is not None:
        summary["mtp_parameters_trained"] = count_params(mtp) - count_params(mtp.lm.model.embed_tokens)
        extra = dict(MOE_EXTRA_CONFIG)
    summary["file_sizes"] = save_hf(model, out_dir, tokenizer_dir, extra)
    if mtp is not None:
        names = save_mtp(out_dir, mtp, model.config.num_hidden_layers)
        summary["mtp_tensors"] = len(names)
        summary["file_sizes"]["model.safetensors"] = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    gen = torch.Generator(device=dev).manual_seed(99)
    sample = Stream(os.path.join(data_dir, "val.npy"), dev).random_batch(4, gen)
    summary["verify"] = verify(model, out_dir, sample, mtp)
    write_json(results_path, summary)
    log(f"{kind}: saved {out_dir}, results {results_path}")

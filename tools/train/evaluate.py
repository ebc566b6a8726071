"""Quality figures of the saved models, on held-out validation text, in exact fp32 on the GPU.

Every model is loaded from its folder by transformers (the shipped bf16 weights, computed in fp32)
and scored on the same fixed validation windows:
  - next-token loss (nats) and top-1 accuracy over EVAL_WINDOWS windows of SEQ_LEN + 1 tokens;
  - loss on positions < SEQ_LEN and >= SEQ_LEN of 2 * SEQ_LEN windows (trained length vs beyond);
  - draft vs target: how often the draft's argmax equals the target's (teacher-forced on validation
    text), the expected acceptance of one draft token when sampling at temperature 1
    (sum_x min(p(x), q(x))), and, on the target's own greedy continuations of validation prompts,
    the greedy acceptance rate and the mean tokens per target step for k = 1..5 draft tokens;
  - MTP: next-next-token accuracy (argmax at i == t_{i+2}), agreement with the main model's own
    next prediction at i + 1, and on the MoE model's greedy continuations the rate at which the
    MTP proposal equals the token the main model then produces (greedy acceptance, k = 1).
"""
import os

import torch
import torch.nn.functional as F

from common import device, exact_fp32, load_hf, log, read_json, write_json
from configs import SEQ_LEN
from data import Stream, load_meta

EVAL_WINDOWS = 256
LONG_WINDOWS = 32
GEN_PROMPTS = 64
GEN_PROMPT_LEN = 64
GEN_NEW = 64
BATCH = 16


@torch.no_grad()
def lm_scores(model, windows):
    """(loss, accuracy) over every position of the windows, plus per-position argmax / logits hook."""
    total_loss = total_right = total = 0.0
    for i in range(0, windows.shape[0], BATCH):
        w = windows[i:i + BATCH]
        logits = model(input_ids=w[:, :-1], use_cache=False).logits.float()
        y = w[:, 1:]
        total_loss += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        total_right += (logits.argmax(-1) == y).sum().item()
        total += y.numel()
    return total_loss / total, total_right / total


@torch.no_grad()
def long_context(model, stream):
    w = stream.fixed_windows(LONG_WINDOWS, 2 * SEQ_LEN)
    losses = []
    for i in range(0, w.shape[0], BATCH // 2):
        b = w[i:i + BATCH // 2]
        logits = model(input_ids=b[:, :-1], use_cache=False).logits.float()
        losses.append(F.cross_entropy(logits.transpose(1, 2), b[:, 1:], reduction="none"))
    loss = torch.cat(losses)  # [N, 2 * SEQ_LEN]
    return {"loss_first_512": loss[:, :SEQ_LEN].mean().item(), "loss_512_to_1024": loss[:, SEQ_LEN:].mean().item()}


@torch.no_grad()
def greedy_continue(model, prompts, n_new):
    ids = prompts
    for _ in range(n_new):
        nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], 1)
    return ids


def tokens_per_step(match, k):
    """Greedy speculation with k draft tokens over a target sequence: per step, the accepted draft
    tokens are the run of matches from the current position (at most k), and the target adds one
    token of its own. Returns mean tokens per target forward pass."""
    steps = tokens = 0
    for row in match.tolist():
        p = 0
        while p < len(row):
            a = 0
            while a < k and p + a < len(row) and row[p + a]:
                a += 1
            steps += 1
            tokens += a + 1
            p += a + 1
    return tokens / steps


@torch.no_grad()
def draft_vs_target(target, draft, windows, prompts):
    agree = accept = total = 0.0
    for i in range(0, windows.shape[0], BATCH):
        x = windows[i:i + BATCH, :-1]
        p = torch.softmax(target(input_ids=x, use_cache=False).logits.float(), -1)
        q = torch.softmax(draft(input_ids=x, use_cache=False).logits.float(), -1)
        agree += (p.argmax(-1) == q.argmax(-1)).sum().item()
        accept += torch.minimum(p, q).sum(-1).sum().item()
        total += x.numel()
    seq = greedy_continue(target, prompts, GEN_NEW)
    d_next = draft(input_ids=seq[:, :-1], use_cache=False).logits.argmax(-1)
    # Positions whose next token the target generated: GEN_PROMPT_LEN - 1 .. end.
    match = (d_next == seq[:, 1:])[:, GEN_PROMPT_LEN - 1:]
    return {"greedy_agreement_on_validation_text": agree / total,
            "expected_acceptance_t1_on_validation_text": accept / total,
            "greedy_acceptance_on_target_continuations": match.float().mean().item(),
            "tokens_per_target_step_greedy": {str(k): round(tokens_per_step(match, k), 3) for k in range(1, 6)}}


@torch.no_grad()
def mtp_scores(main, mtp, windows, prompts):
    from mtp import positions_like

    right = agree = total = 0.0
    for i in range(0, windows.shape[0], BATCH):
        w = windows[i:i + BATCH]
        x, y = w[:, :-1], w[:, 1:]
        h = main.model(input_ids=x, use_cache=False).last_hidden_state
        main_next = main.lm_head(h).argmax(-1)
        guess = mtp(y, h, positions_like(x)).argmax(-1)[:, :-1]  # at i: predicts t_{i+2}
        right += (guess == w[:, 2:]).sum().item()
        agree += (guess == main_next[:, 1:]).sum().item()
        total += guess.numel()
    seq = greedy_continue(main, prompts, GEN_NEW)
    x = seq[:, :-1]
    h = main.model(input_ids=x, use_cache=False).last_hidden_state
    guess = mtp(seq[:, 1:], h, positions_like(x)).argmax(-1)[:, :-1]
    match = (guess == seq[:, 2:])[:, GEN_PROMPT_LEN - 1:]
    return {"next_next_token_accuracy": right / total, "agreement_with_main_next_prediction": agree / total,
            "greedy_acceptance_on_own_continuations": match.float().mean().item(),
            "tokens_per_target_step_greedy_k1": round(tokens_per_step(match, 1), 3)}


def evaluate(kind, models_root, data_dir, results_path, dry=False):
    from configs import NAMES
    from mtp import load_mtp

    exact_fp32()
    dev = device()
    stream = Stream(os.path.join(data_dir, "val.npy"), dev)
    n_windows = 16 if dry else EVAL_WINDOWS
    windows = stream.fixed_windows(n_windows)
    prompts = stream.fixed_windows(GEN_PROMPTS if not dry else 4, GEN_PROMPT_LEN)[:, :GEN_PROMPT_LEN]
    folder = os.path.join(models_root, NAMES[kind])
    model, _ = load_hf(folder, torch.float32, "sdpa", dev)
    loss, acc = lm_scores(model, windows)
    res = {"model": NAMES[kind], "val_windows": windows.shape[0], "val_tokens_scored": windows.shape[0] * SEQ_LEN,
           "val_loss": loss, "val_next_token_accuracy": acc, "long_context": long_context(model, stream),
           "data": {k: v for k, v in load_meta(data_dir).items() if k != "roots"}}
    log(f"eval {kind}: loss {loss:.4f} acc {acc:.4f}")
    if kind == "draft":
        target, _ = load_hf(os.path.join(models_root, NAMES["tiny"]), torch.float32, "sdpa", dev)
        res["vs_target"] = draft_vs_target(target, model, windows, prompts)
        log(f"eval draft vs target: {res['vs_target']}")
    if kind == "moe":
        mtp = load_mtp(folder, torch.float32, "sdpa", dev)
        res["mtp"] = mtp_scores(model, mtp, windows, prompts)
        log(f"eval mtp: {res['mtp']}")
    train_path = results_path.replace(".eval.json", ".train.json")
    if os.path.exists(train_path):
        res["training"] = {k: v for k, v in read_json(train_path).items() if k not in ("history", "verify")}
    write_json(results_path, res)
    return res

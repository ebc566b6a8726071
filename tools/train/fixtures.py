"""Reference outputs of the embedded models from transformers, for specula's tests.

tests/fixtures/embedded/<model>/reference.safetensors, for each of two prompts of Python text
(tokenized by the models' tokenizer), computed on the CPU in fp32 with eager attention from the
shipped bf16 checkpoint, named as tests/fixtures/models/*/reference.safetensors:
  prompt_i      I32 [T]     the prompt's token ids
  logits_i      F32 [4, V]  logits at the last 4 prompt positions
  logits_pos_i  I32 [4]     which positions (T-4 .. T-1)
  greedy_i      I32 [32]    greedy continuation (argmax, recomputed over the whole sequence each step,
                            not stopped at end-of-text)
  greedy_margin_i F32 [32]  at each greedy step, (top-1 - top-2 logit) / max |logit|: where this is
                            small a bf16 engine may pick the runner-up (a near-tie), see
                            tests/unit/spec_decode/reference_fixture.h
and for specula-tiny-moe
  mtp_logits_i  F32 [4, V]  the MTP layer's logits at the same positions p: inputs h_p (main model's
                            final hidden state after model.norm) and the embedding of token p+1,
                            where token T (after the prompt) is greedy_i[0]; predicts token p+2.
Also <model>/sample.txt (a greedy generation from a Python prompt and from a chat prompt), and
tokenizer.json / chat_template.json in the schema of tests/fixtures/tokenizers/*.json and
tests/fixtures/chat_templates/*.json.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

from common import load_hf, log
from configs import IM_END_ID, ENDOFTEXT_ID, NAMES

N_LAST = 4
N_GREEDY = 32

PROMPTS = [
    'import os\nimport sys\n\n\ndef read_lines(path):\n    """Return the lines of a text file without '
    'their line endings."""\n    with open(path, encoding="utf-8") as f:\n        return [line.rstrip("\\n") '
    'for line in f]\n\n\ndef main(argv):\n',
    'class Stack:\n    """A last-in, first-out container."""\n\n    def __init__(self):\n        self._items = []'
    '\n\n    def push(self, item):\n        self._items.append(item)\n\n    def pop(self):\n',
]
SAMPLE_PROMPT = ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')
SAMPLE_CHAT = [{"role": "user", "content": "Write the Python module utils/strings.py. "
                                           "Helpers for working with text."}]


@torch.no_grad()
def greedy(model, ids, n, stop=()):
    """The greedy continuation, and each step's top-two margin in logits and relative to max |logit|."""
    margins, relative = [], []
    out = list(ids)
    for _ in range(n):
        last = model(input_ids=torch.tensor([out]), use_cache=False).logits[0, -1].float()
        top2 = last.topk(2).values
        margins.append((top2[0] - top2[1]).item())
        relative.append(margins[-1] / last.abs().max().item())
        out.append(int(last.argmax()))
        if out[-1] in stop:
            break
    return out[len(ids):], margins, relative


def model_reference(kind, models_root, out_root, tok):
    from mtp import load_mtp, positions_like

    folder = os.path.join(models_root, NAMES[kind])
    model, _ = load_hf(folder, torch.float32, "eager", "cpu")
    mtp = load_mtp(folder, torch.float32, "eager", "cpu") if kind == "moe" else None
    tensors, margins = {}, []
    with torch.no_grad():
        for i, text in enumerate(PROMPTS):
            ids = tok.encode(text).ids
            t = len(ids)
            x = torch.tensor([ids])
            out = model(input_ids=x, use_cache=False)
            logits = out.logits[0].float()
            gen, m, relative = greedy(model, ids, N_GREEDY)
            margins += m
            pos = list(range(t - N_LAST, t))
            tensors[f"prompt_{i}"] = torch.tensor(ids, dtype=torch.int32)
            tensors[f"logits_{i}"] = logits[pos].contiguous()
            tensors[f"logits_pos_{i}"] = torch.tensor(pos, dtype=torch.int32)
            tensors[f"greedy_{i}"] = torch.tensor(gen, dtype=torch.int32)
            tensors[f"greedy_margin_{i}"] = torch.tensor(relative, dtype=torch.float32)
            if mtp is not None:
                h = model.model(input_ids=x, use_cache=False).last_hidden_state
                next_ids = torch.tensor([ids[1:] + [gen[0]]])
                mtp_logits = mtp(next_ids, h, positions_like(x))[0].float()
                tensors[f"mtp_logits_{i}"] = mtp_logits[pos].contiguous()
                # The MTP guess at T-1 is for the second generated token: report how often it is right.
                log(f"fixture {kind} prompt {i}: MTP argmax at last position {int(mtp_logits[-1].argmax())}, "
                    f"greedy[1] {gen[1]}")
    import transformers

    out_dir = os.path.join(out_root, NAMES[kind])
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"), metadata={
        "generator": f"transformers {transformers.__version__}, torch {torch.__version__}, fp32 eager, CPU",
        "model": NAMES[kind],
        "prompt_0_text": PROMPTS[0], "prompt_1_text": PROMPTS[1],
        "min_greedy_margin": f"{min(margins):.4f}"})
    log(f"fixture {kind}: {sorted(tensors)} min greedy margin {min(margins):.4f}")
    write_sample(model, tok, out_dir, kind)


def write_sample(model, tok, out_dir, kind):
    stop = (ENDOFTEXT_ID, IM_END_ID)
    ids = tok.encode(SAMPLE_PROMPT).ids
    gen, _, _ = greedy(model, ids, 160, stop)
    from source_corpus import render_chat

    chat = render_chat(SAMPLE_CHAT) + "<|im_start|>assistant\n"
    chat_ids = tok.encode(chat).ids
    chat_gen, _, _ = greedy(model, chat_ids, 200, stop)
    with open(os.path.join(out_dir, "sample.txt"), "w", encoding="utf-8") as f:
        f.write(f"# {NAMES[kind]}: greedy generation (transformers, fp32, CPU), up to 160 tokens or an end token.\n")
        f.write("# ---- prompt + continuation ----\n")
        f.write(tok.decode(ids + gen, skip_special_tokens=False))
        f.write("\n# ---- chat prompt (rendered with the chat template) + continuation, up to 200 tokens ----\n")
        f.write(tok.decode(chat_ids + chat_gen, skip_special_tokens=False))
        f.write("\n")


def tokenizer_reference(models_root, out_root):
    """The tokenizer and chat template fixtures, in the schema of tests/fixtures/{tokenizers,chat_templates}."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "refs"))
    from corpus import TEXTS as REF_TEXTS  # noqa: tools/refs/corpus.py
    from make_refs import chat_cases

    folder = os.path.join(models_root, NAMES["tiny"])
    tk = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(folder)
    texts = list(REF_TEXTS) + PROMPTS + [SAMPLE_PROMPT]
    cases = []
    for text in texts:
        ids = tk.encode(text, add_special_tokens=True).ids
        cases.append({"text": text, "ids": ids, "ids_no_special": tk.encode(text, add_special_tokens=False).ids,
                      "decoded": tk.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tk.decode(ids, skip_special_tokens=True),
                      "transformers_ids": hf(text)["input_ids"],
                      "transformers_decoded": hf.decode(ids, skip_special_tokens=False)})
    gen = torch.Generator().manual_seed(1234)
    decode_cases = []
    for n in [1, 2, 3, 5, 8, 13, 40]:
        ids = torch.randint(0, tk.get_vocab_size(), (n,), generator=gen).tolist()
        decode_cases.append({"ids": ids, "decoded": tk.decode(ids, skip_special_tokens=False),
                             "decoded_skip": tk.decode(ids, skip_special_tokens=True)})
    doc = {"tokenizer": "specula-tiny", "generator": "tokenizers.Tokenizer.from_file(tokenizer.json)",
           "bos_token": None, "eos_token": hf.eos_token, "add_bos_token": False,
           "vocab_size": tk.get_vocab_size(), "cases": cases, "decode_cases": decode_cases}
    with open(os.path.join(out_root, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
    chats = []
    for case in chat_cases():
        entry = {"name": case["name"], "messages": case["messages"], "tools": case.get("tools"),
                 "add_generation_prompt": case["agp"], "kwargs": case.get("kwargs", {}),
                 "bos_token": hf.bos_token, "eos_token": hf.eos_token}
        try:
            text = hf.apply_chat_template(case["messages"], tools=case.get("tools"), add_generation_prompt=case["agp"],
                                          tokenize=False, **case.get("kwargs", {}))
            entry["rendered"] = text
            entry["token_ids"] = hf(text, add_special_tokens=False)["input_ids"]
        except Exception as e:  # the template raised for this message shape
            entry["error"] = f"{type(e).__name__}: {e}"
        chats.append(entry)
    with open(os.path.join(out_root, "chat_template.json"), "w", encoding="utf-8") as f:
        json.dump({"template": "specula-tiny", "generator": "transformers apply_chat_template", "cases": chats},
                  f, ensure_ascii=False, indent=1)
    differ = sum(c["ids"] != c["transformers_ids"] for c in cases)
    log(f"fixture tokenizer: {len(cases)} cases (transformers differs on {differ}), "
        f"{len(chats)} chat cases ({sum('error' in c for c in chats)} raise)")


def add_greedy_margins(kinds, models_root, fixtures_root, out_root):
    """Adds greedy_margin_i to existing reference fixtures, leaving every other tensor as it was
    (the greedy tokens are recomputed and must be the stored ones)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    for kind in kinds:
        path = os.path.join(fixtures_root, NAMES[kind], "reference.safetensors")
        tensors = load_file(path)
        with safe_open(path, "pt") as f:
            metadata = f.metadata()
        model, _ = load_hf(os.path.join(models_root, NAMES[kind]), torch.float32, "eager", "cpu")
        for i in range(len(PROMPTS)):
            gen, _, relative = greedy(model, tensors[f"prompt_{i}"].tolist(), N_GREEDY)
            assert gen == tensors[f"greedy_{i}"].tolist(), f"{kind} prompt {i}: greedy tokens changed"
            tensors[f"greedy_margin_{i}"] = torch.tensor(relative, dtype=torch.float32)
            log(f"fixture {kind} prompt {i}: smallest relative greedy margins "
                f"{sorted(round(r, 5) for r in relative)[:3]}")
        os.makedirs(os.path.join(out_root, NAMES[kind]), exist_ok=True)
        save_file(tensors, os.path.join(out_root, NAMES[kind], "reference.safetensors"), metadata=metadata)


def make_fixtures(kinds, models_root, out_root):
    from tokenizers import Tokenizer

    torch.set_num_threads(min(16, os.cpu_count() or 1))
    os.makedirs(out_root, exist_ok=True)
    tok = Tokenizer.from_file(os.path.join(models_root, NAMES["tiny"], "tokenizer.json"))
    for kind in kinds:
        model_reference(kind, models_root, out_root, tok)
    if "tiny" in kinds:
        tokenizer_reference(models_root, out_root)

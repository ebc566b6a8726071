"""Byte-level BPE tokenizer trained with HF `tokenizers`, laid out like Qwen2/Qwen3's tokenizer.json.

NFC normalizer, a Split pre-tokenizer with the Qwen2 regex (isolated) followed by ByteLevel without
its own regex, ByteLevel post-processor and decoder, no unk token, no byte fallback. The special
tokens take ids 0..2. tokenizer_config.json carries a ChatML template in the Qwen style, written
with plain Jinja (for, if, string concatenation, add_generation_prompt) so that any interpreter of
the common subset renders it.
"""
import json
import os

from configs import MAX_POSITIONS, SPECIAL_TOKENS, VOCAB_SIZE

# Qwen2's pre-tokenizer pattern: contractions, letters with one leading non-letter, single digits,
# punctuation runs, newline runs, and whitespace runs that leave their last space to the next word
# (so Python indentation becomes whole tokens).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

TOKENIZER_TRAIN_CHARS = 48_000_000


def train_tokenizer(texts, log=print):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    sample, total = [], 0
    for t in texts:
        if total >= TOKENIZER_TRAIN_CHARS:
            break
        sample.append(t)
        total += len(t)
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, f"special token {s} has id {tok.token_to_id(s)}, expected {i}"
    assert tok.get_vocab_size() == VOCAB_SIZE, f"vocab {tok.get_vocab_size()} != {VOCAB_SIZE}"
    log(f"tokenizer: trained on {len(sample)} files ({total} chars), vocab {tok.get_vocab_size()}")
    return tok


def tokenizer_config():
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, s in enumerate(SPECIAL_TOKENS)}
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": MAX_POSITIONS,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def save_tokenizer(tok, folder):
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(), f, indent=2, ensure_ascii=False)
        f.write("\n")


def check_with_transformers(folder, log=print):
    """transformers loads the folder, renders the template as corpus.render_chat does, and
    tokenizes code the same way as the bare tokenizer."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from source_corpus import render_chat

    hf = AutoTokenizer.from_pretrained(folder)
    raw = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    msgs = [{"role": "system", "content": "You write Python."},
            {"role": "user", "content": "Write a function that adds two numbers."}]
    rendered = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    expect = render_chat(msgs) + "<|im_start|>assistant\n"
    assert rendered == expect, f"chat template renders {rendered!r}, expected {expect!r}"
    code = "def add(a, b):\n    return a + b\n\n\nclass Foo(object):\n    pass\n"
    ids = hf(code)["input_ids"]
    assert ids == raw.encode(code).ids, "transformers and tokenizers disagree on plain code"
    assert hf.decode(ids) == code, "decode does not round-trip"
    assert hf.eos_token == "<|endoftext|>" and hf.bos_token is None
    ids_chat = hf(rendered, add_special_tokens=False)["input_ids"]
    assert ids_chat[0] == 1 and 2 in ids_chat, "special tokens not recognised in rendered chat"
    log(f"tokenizer: transformers {type(hf).__name__} loads it; template and ids agree "
        f"({len(ids)} tokens for {len(code)} chars of code)")

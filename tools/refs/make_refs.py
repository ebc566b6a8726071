"""Reference fixtures from HF transformers / tokenizers (run on the GPU machine, which has them).

Writes, under --out (normally tests/fixtures):
  tokenizers/<name>.json      ids and decodes of the torture corpus for each real tokenizer
  chat_templates/<name>.json  transformers' apply_chat_template output for several conversations
  models/<variant>/           tiny random checkpoints saved by transformers + reference.safetensors
                              (prompt_i, logits_i [T, V] in fp32, greedy_i) for each variant

Nothing here is used at run time; tests compare specula against these files.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
from corpus import TEXTS  # noqa: E402

TOKENIZERS = ["qwen3", "deepseek_v3", "llama3"]


def make_tokenizer_refs(tok_root, out_dir):
    """The reference is the HF `tokenizers` library on tokenizer.json, plus the bos token that
    tokenizer_config.json's add_bos_token asks for (what transformers 4's fast tokenizers did and
    what vLLM users got). transformers 5's own outputs are recorded beside it for information: for
    the DeepSeek-V3 tokenizer (tokenizer_class LlamaTokenizerFast) it drops add_bos_token and
    decodes "Hello, world!" as "Hello,world!", which no user wants."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    os.makedirs(out_dir, exist_ok=True)
    for name in TOKENIZERS:
        folder = os.path.join(tok_root, name)
        tk = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            tcfg = json.load(f)
        bos = tcfg.get("bos_token")
        if isinstance(bos, dict):
            bos = bos["content"]
        eos = tcfg.get("eos_token")
        if isinstance(eos, dict):
            eos = eos["content"]
        bos_ids = [tk.token_to_id(bos)] if tcfg.get("add_bos_token") and bos else []
        hf = AutoTokenizer.from_pretrained(folder)
        rng = random.Random(1234)
        cases = []
        for text in TEXTS:
            ids_ns = tk.encode(text, add_special_tokens=False).ids
            ids = bos_ids + tk.encode(text, add_special_tokens=True).ids
            cases.append({
                "text": text,
                "ids": ids,
                "ids_no_special": ids_ns,
                "decoded": tk.decode(ids, skip_special_tokens=False),
                "decoded_skip": tk.decode(ids, skip_special_tokens=True),
                "transformers_ids": hf(text)["input_ids"],
                "transformers_decoded": hf.decode(ids, skip_special_tokens=False),
            })
        decode_cases = []
        vocab = tk.get_vocab_size(with_added_tokens=True)
        for n in [1, 2, 3, 5, 8, 13, 40]:
            ids = [rng.randrange(vocab) for _ in range(n)]
            decode_cases.append({
                "ids": ids,
                "decoded": tk.decode(ids, skip_special_tokens=False),
                "decoded_skip": tk.decode(ids, skip_special_tokens=True),
            })
        doc = {
            "tokenizer": name,
            "generator": "tokenizers.Tokenizer.from_file(tokenizer.json) + bos per add_bos_token",
            "bos_token": bos,
            "eos_token": eos,
            "add_bos_token": bool(bos_ids),
            "vocab_size": vocab,
            "cases": cases,
            "decode_cases": decode_cases,
        }
        with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
        differ = sum(1 for c in cases if c["transformers_ids"] != c["ids"])
        print(f"tokenizers/{name}.json: {len(cases)} cases, {len(decode_cases)} decode cases, "
              f"transformers ids differ on {differ}")


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


def chat_cases():
    sys_user = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 is 4."},
        {"role": "user", "content": "And 3+3?"},
    ]
    return [
        {"name": "single_user", "messages": [{"role": "user", "content": "Hello!"}], "agp": True},
        {"name": "single_user_no_prompt", "messages": [{"role": "user", "content": "Hello!"}], "agp": False},
        {"name": "system_multi_turn", "messages": sys_user, "agp": True},
        {"name": "system_multi_turn_no_prompt", "messages": sys_user, "agp": False},
        {"name": "two_systems", "messages": [
            {"role": "system", "content": "Rule one."},
            {"role": "system", "content": "Rule two."},
            {"role": "user", "content": "Go."}], "agp": True},
        {"name": "reasoning_content_field", "messages": [
            {"role": "user", "content": "Think about 7*6."},
            {"role": "assistant", "content": "It is 42.", "reasoning_content": "7 times 6 is 42."},
            {"role": "user", "content": "Now 8*9?"}], "agp": True},
        {"name": "reasoning_last_assistant", "messages": [
            {"role": "user", "content": "Think about 7*6."},
            {"role": "assistant", "content": "It is 42.", "reasoning_content": "\n7 times 6 is 42.\n"}], "agp": False},
        {"name": "inline_think_tags", "messages": [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "<think>\nfirst thoughts\n</think>\n\nA1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "<think>second</think>A2"}], "agp": False},
        {"name": "enable_thinking_false", "messages": [{"role": "user", "content": "Be quick."}], "agp": True,
         "kwargs": {"enable_thinking": False}},
        {"name": "enable_thinking_true", "messages": [{"role": "user", "content": "Take your time."}], "agp": True,
         "kwargs": {"enable_thinking": True}},
        {"name": "tools_call_dict_args", "tools": [WEATHER_TOOL], "messages": [
            {"role": "system", "content": "You can use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
            {"role": "tool", "content": "{\"temp\": 21}"},
            {"role": "tool", "content": "{\"sky\": \"clear\"}"}], "agp": True},
        {"name": "tools_call_string_args", "tools": [WEATHER_TOOL], "messages": [
            {"role": "user", "content": "Weather in Oslo and Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
                {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
            {"role": "tool", "content": "cold"},
            {"role": "tool", "content": "warm"},
            {"role": "assistant", "content": "Oslo is cold, Rome is warm."}], "agp": False},
        {"name": "tools_only_declared", "tools": [WEATHER_TOOL], "messages": [
            {"role": "user", "content": "Hi"}], "agp": True},
        {"name": "trim_whitespace", "messages": [
            {"role": "user", "content": "  padded question  \n\n"},
            {"role": "assistant", "content": "\n answer \t"}], "agp": True},
        {"name": "unicode", "tools": [{"type": "function", "function": {
            "name": "translate", "description": "Übersetze — 翻译 👋", "parameters": {"type": "object", "properties": {}}}}],
         "messages": [{"role": "user", "content": "你好 👋 ¿qué tal?"}], "agp": True},
    ]


def make_chat_template_refs(tok_root, out_dir):
    from transformers import AutoTokenizer

    os.makedirs(out_dir, exist_ok=True)
    for name in TOKENIZERS:
        tok = AutoTokenizer.from_pretrained(os.path.join(tok_root, name))
        out_cases = []
        for case in chat_cases():
            kwargs = dict(case.get("kwargs", {}))
            entry = {
                "name": case["name"],
                "messages": case["messages"],
                "tools": case.get("tools"),
                "add_generation_prompt": case["agp"],
                "kwargs": kwargs,
                "bos_token": tok.bos_token,
                "eos_token": tok.eos_token,
            }
            try:
                text = tok.apply_chat_template(case["messages"], tools=case.get("tools"),
                                               add_generation_prompt=case["agp"], tokenize=False, **kwargs)
                entry["rendered"] = text
                entry["token_ids"] = tok(text, add_special_tokens=False)["input_ids"]
            except Exception as e:  # the template itself raised (e.g. unsupported message shape)
                entry["error"] = f"{type(e).__name__}: {e}"
            out_cases.append(entry)
        doc = {"template": name, "generator": "transformers apply_chat_template", "cases": out_cases}
        with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
        n_err = sum(1 for c in out_cases if "error" in c)
        print(f"chat_templates/{name}.json: {len(out_cases)} cases ({n_err} raise)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", required=True, help="folder with qwen3/ deepseek_v3/ llama3/ tokenizer folders")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="tokenizers,chat_templates,models")
    args = ap.parse_args()
    only = args.only.split(",")
    if "tokenizers" in only:
        make_tokenizer_refs(args.tokenizers, os.path.join(args.out, "tokenizers"))
    if "chat_templates" in only:
        make_chat_template_refs(args.tokenizers, os.path.join(args.out, "chat_templates"))
    if "models" in only:
        from model_refs import make_model_refs
        make_model_refs(os.path.join(args.out, "models"))

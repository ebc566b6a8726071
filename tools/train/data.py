"""Token streams: the corpus tokenized once into flat arrays, and the batches cut from them.

Each document is followed by <|endoftext|>. Training batches are windows of SEQ_LEN + 1 tokens at
random offsets (seeded); validation uses fixed, non-overlapping windows from the start of the
held-out stream, so every model is scored on exactly the same tokens.
"""
import json
import os

import numpy as np
import torch

from configs import ENDOFTEXT_ID, SEQ_LEN
from source_corpus import training_text


def encode_docs(tok, docs, chunk=2000):
    parts = []
    for i in range(0, len(docs), chunk):
        texts = [training_text(d) for d in docs[i:i + chunk]]
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=np.uint16))
            parts.append(np.asarray([ENDOFTEXT_ID], dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def write_streams(tok, train_docs, val_docs, stats, out_dir, log=print):
    os.makedirs(out_dir, exist_ok=True)
    train = encode_docs(tok, train_docs)
    val = encode_docs(tok, val_docs)
    np.save(os.path.join(out_dir, "train.npy"), train)
    np.save(os.path.join(out_dir, "val.npy"), val)
    meta = dict(stats, train_tokens=int(train.size), val_tokens=int(val.size),
                chars_per_token=round(stats["train_chars"] / max(1, train.size), 3))
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    log(f"data: {train.size} train tokens, {val.size} val tokens, "
        f"{meta['chars_per_token']} chars/token")
    return meta


class Stream:
    """A token array on the device; windows of seq_len + 1 tokens."""

    def __init__(self, path, device, seq_len=SEQ_LEN):
        arr = np.load(path).astype(np.int32)
        self.tokens = torch.from_numpy(arr).to(device)
        self.seq_len = seq_len
        self.device = device

    def __len__(self):
        return self.tokens.numel()

    def random_batch(self, batch, gen):
        n = self.tokens.numel() - self.seq_len - 1
        starts = torch.randint(0, n, (batch,), device=self.device, generator=gen)
        idx = starts[:, None] + torch.arange(self.seq_len + 1, device=self.device)[None, :]
        return self.tokens[idx].long()

    def fixed_windows(self, max_windows, seq_len=None):
        seq_len = seq_len or self.seq_len
        n = min(max_windows, self.tokens.numel() // (seq_len + 1))
        return self.tokens[: n * (seq_len + 1)].view(n, seq_len + 1).long()


def load_meta(data_dir):
    with open(os.path.join(data_dir, "meta.json")) as f:
        return json.load(f)

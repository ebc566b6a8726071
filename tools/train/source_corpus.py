"""The training corpus: the Python source files of the machine's Python installations.

Files come from the standard library and site-packages of every Python found (sys.prefix paths,
sysconfig, site, /usr/lib/python3*, /usr/local/lib/python3*), are deduplicated by content hash,
filtered (size, strict UTF-8, no generated-looking lines, no literal special-token strings), and
ordered by hash, so the same installation always gives the same corpus. About 5% of the files,
chosen by hash, are held out for validation. A tenth of the files, also chosen by hash, are wrapped
in a ChatML exchange (a user asks for the module, the assistant answers with its source) so that
the models also answer through the chat template and end their answer with <|im_end|>.
"""
import glob
import hashlib
import os
import re
import site
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from configs import SPECIAL_TOKENS

MIN_BYTES = 200
MAX_BYTES = 200_000          # larger files are mostly generated tables
MAX_LINE = 1000              # a longer line means data or minified code
MAX_MEAN_LINE = 100
VAL_MODULUS = 20             # sha % 20 == 0 -> validation (~5%)
CHAT_MODULUS = 10            # another slice of the hash % 10 == 0 -> ChatML-wrapped


@dataclass
class Doc:
    sha: str
    rel: str      # path relative to the root it was found under (shortest over duplicates)
    text: str

    @property
    def is_val(self):
        return int(self.sha[:8], 16) % VAL_MODULUS == 0

    @property
    def is_chat(self):
        return int(self.sha[8:16], 16) % CHAT_MODULUS == 0


def python_roots():
    roots = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(paths[key])
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # virtualenvs of old
        pass
    for prefix in {sys.prefix, sys.base_prefix, "/usr", "/usr/local"}:
        roots.update(glob.glob(os.path.join(prefix, "lib", "python3*")))
    return sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)})


def list_files(roots):
    """(realpath, relative path) of every .py file, each real file once."""
    seen = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in filenames:
                if not name.endswith(".py"):
                    continue
                full = os.path.join(dirpath, name)
                real = os.path.realpath(full)
                rel = os.path.relpath(full, root)
                if real not in seen or len(rel) < len(seen[real]):
                    seen[real] = rel
    return sorted(seen.items())


def accept(text):
    """Why a decoded file is rejected, or None."""
    if "\x00" in text:
        return "nul"
    if any(tok in text for tok in SPECIAL_TOKENS):
        return "special-token literal"
    lines = text.split("\n")
    if max(len(line) for line in lines) > MAX_LINE:
        return "long line"
    if len(text) / len(lines) > MAX_MEAN_LINE:
        return "long mean line"
    return None


def _read(item):
    real, rel = item
    try:
        size = os.path.getsize(real)
        if size < MIN_BYTES or size > MAX_BYTES:
            return None, "size"
        with open(real, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8")  # strict: undecodable files are dropped
    except (OSError, UnicodeDecodeError):
        return None, "unreadable or not UTF-8"
    why = accept(text)
    if why:
        return None, why
    return Doc(hashlib.sha256(raw).hexdigest(), rel, text), None


def collect(max_train_bytes, max_files=None, log=print):
    """Returns (train docs, val docs, stats). Deterministic for a given installation."""
    roots = python_roots()
    files = list_files(roots)
    if max_files:
        files = files[:max_files]
    rejected = {}
    docs = {}
    with ThreadPoolExecutor(16) as pool:
        for doc, why in pool.map(_read, files, chunksize=64):
            if doc is None:
                rejected[why] = rejected.get(why, 0) + 1
            elif doc.sha not in docs or len(doc.rel) < len(docs[doc.sha].rel):
                docs[doc.sha] = doc
    ordered = [docs[k] for k in sorted(docs)]
    val = [d for d in ordered if d.is_val]
    train, total = [], 0
    for d in ordered:
        if d.is_val:
            continue
        if total + len(d.text) > max_train_bytes:
            continue
        train.append(d)
        total += len(d.text)
    fingerprint = hashlib.sha256("".join(d.sha for d in ordered).encode()).hexdigest()[:16]
    stats = {
        "roots": roots,
        "files_seen": len(files),
        "rejected": rejected,
        "unique_files": len(ordered),
        "duplicates_dropped": len(files) - sum(rejected.values()) - len(ordered),
        "train_files": len(train),
        "train_chars": sum(len(d.text) for d in train),
        "val_files": len(val),
        "val_chars": sum(len(d.text) for d in val),
        "chat_wrapped_train_files": sum(d.is_chat for d in train),
        "fingerprint": fingerprint,
    }
    log(f"corpus: {stats}")
    return train, val, stats


_DOCSTRING = re.compile(r'^\s*(?:#[^\n]*\n\s*)*[rRuU]?("""|\'\'\')\s*([^\n]*?)\s*(?:\1|\n)')


def chat_request(doc):
    """The user turn asking for this module: its path, plus its docstring's first line if short."""
    parts = doc.rel.split(os.sep)
    starts = [i + 1 for i, p in enumerate(parts[:-1]) if p in ("site-packages", "dist-packages")
              or p.startswith("python3")]
    request = f"Write the Python module {'/'.join(parts[max(starts, default=0):])}."
    m = _DOCSTRING.match(doc.text)
    if m and m.group(2) and len(m.group(2)) <= 120:
        request += " " + m.group(2)
    return request


def render_chat(messages):
    """What the chat template in tokenizer_config.json renders, without a generation prompt."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def training_text(doc):
    """The text a document contributes (the <|endoftext|> separator is added by the tokenizer step)."""
    if doc.is_chat:
        return render_chat([{"role": "user", "content": chat_request(doc)},
                            {"role": "assistant", "content": doc.text}])
    return doc.text

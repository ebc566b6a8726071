"""Small helpers shared by the training stages: logging, precision settings, model loading."""
import json
import os
import sys
import time

import torch

_T0 = time.time()


def log(msg):
    print(f"[{time.time() - _T0:7.1f}s] {msg}", flush=True)


def exact_fp32():
    """Reference figures are computed in real fp32: no TF32 in matmuls or convolutions."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def fast_training():
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def write_json(path, obj):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def read_json(path):
    with open(path) as f:
        return json.load(f)


def load_hf(folder, dtype=torch.float32, attn="sdpa", dev=None):
    """transformers' own loader; returns (model, loading info)."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn,
                                                       output_loading_info=True)
    return model.to(dev or device()).eval(), info


def count_params(module):
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def command_line():
    return "python3 " + " ".join(sys.argv)

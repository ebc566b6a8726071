"""PyTorch's own attention kernels on the prefill shape cuda_roofline times (Llama-3.1-8B heads:
32 query heads, 8 kv heads, head dim 128, causal, bf16), as an anchor nobody here wrote.
Usage: python3 tools/gpu/sdpa_anchor.py [tokens ...]   (default 4096 1024)"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    tokens_list = [int(t) for t in sys.argv[1:]] or [4096, 1024]
    hq, hk, d = 32, 8, 128
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for n in tokens_list:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, hk, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, hk, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
        ke, ve = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
        flops = 4.0 * n * (n + 1) / 2 * hq * d
        for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
            try:
                with sdpa_kernel(backend):
                    ms = time_ms(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True))
                print(f"sdpa {name:9s} tokens={n:5d}: {ms:8.4f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")
            except RuntimeError as e:
                print(f"sdpa {name:9s} tokens={n:5d}: unavailable ({str(e).splitlines()[0][:80]})")


if __name__ == "__main__":
    main()

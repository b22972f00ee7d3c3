"""Why bf16 misses the 1e-2 logit tolerance: relative error of low-precision logits on the GPU.

Per dtype variant and bucket, ‖logits − fp32 eager‖ / ‖fp32 eager‖ over fresh uniform-noise
inputs (what start-up validation uses) and over real Fashion-MNIST test images.

    python3 bench/dtype_error.py --out bench/results/<date>-dtype-error.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from app.config import DEFAULT_BUCKETS
from models.cnn import load_model
from models.fashion_mnist import load_test_sample

DEVICE = torch.device("cuda:0")


def errors(module: torch.nn.Module, dtype: torch.dtype, inputs: list[torch.Tensor], benchmark: bool) -> list[float]:
    torch.backends.cudnn.benchmark = benchmark
    out = []
    with torch.inference_mode():
        for x in inputs:
            want = module(x)
            with torch.autocast("cuda", dtype=dtype, cache_enabled=False):
                got = module(x).float()
            out.append(float((got - want).norm() / want.norm()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    module = load_model(device=DEVICE)
    images = torch.from_numpy(load_test_sample()[0].astype(np.float32) / 255).reshape(-1, 1, 28, 28).to(DEVICE)
    record: dict[str, object] = {"command": " ".join(["python3", *sys.argv]), "gpu": torch.cuda.get_device_name()}
    for name, dtype, benchmark in (
        ("fp16", torch.float16, True),
        ("bf16", torch.bfloat16, True),
        ("bf16_no_cudnn_benchmark", torch.bfloat16, False),
    ):
        rows = {}
        for bucket in DEFAULT_BUCKETS:
            noise = [torch.rand((bucket, 1, 28, 28), device=DEVICE) for _ in range(20)]
            real = [images[i * bucket : (i + 1) * bucket] for i in range(min(20, 1000 // bucket))]
            e_noise, e_real = errors(module, dtype, noise, benchmark), errors(module, dtype, real, benchmark)
            rows[str(bucket)] = {
                "noise_max": max(e_noise),
                "noise_median": statistics.median(e_noise),
                "real_max": max(e_real),
                "real_median": statistics.median(e_real),
            }
        record[name] = rows
        worst = max(r["noise_max"] for r in rows.values())
        print(f"{name:26s} worst noise {worst:.4f}  worst real {max(r['real_max'] for r in rows.values()):.4f}")
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()

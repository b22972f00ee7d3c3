"""The process-wide numeric flags, decided once from every model's dtype before any engine is built.

TF32 in cuDNN and cuBLAS is a switch of the whole process, not of a module: an engine that flipped
it for itself changed every model built before it, after they were validated. So the service
decides once from all its models — TF32 only where no model runs fp32 ("fp32 means fp32") — and
each engine checks the decision fits its dtype. An engine built on its own (tests, benchmarks)
decides for itself when nothing was decided before it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_tf32: bool | None = None  # None: not decided yet in this process


def decide(dtypes: Iterable[str]) -> None:
    """Set the flags for models of these dtypes ("fp32", "fp16", "bf16"); call before building engines."""
    global _tf32
    _tf32 = all(dtype != "fp32" for dtype in dtypes)
    # cuDNN benchmarks each fixed shape once, at warm-up, and the graphs bake in the winner.
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = _tf32
    torch.backends.cuda.matmul.allow_tf32 = _tf32
    # fp16/bf16 run under autocast: full fp32 accumulation in matmuls keeps logits within 1e-2.
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def require(dtype: str) -> None:
    """An engine of `dtype` is about to be built: decide now if nobody has, refuse a TF32 process for fp32."""
    if _tf32 is None:
        decide([dtype])
    elif _tf32 and dtype == "fp32":
        raise RuntimeError(
            "an fp32 model cannot join a process that runs TF32 for the fp16/bf16 models it started with (TF32 is "
            "the whole process's switch, and fp32 means fp32): set this model's dtype to fp16 or bf16, or restart "
            "the server with it in the repository"
        )

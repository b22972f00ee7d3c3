"""p08: cpu_compiled_engine with inductor replaced by dynamo's eager backend (no C++ compiler here): does serving
(on the engine's own thread, after the build thread's warm-up) compile again, and what does a nondeterministic or
NaN-producing model do to the warm-up check?"""
import asyncio, dataclasses
import numpy as np, torch, torch._dynamo
from torch import nn
import app.engines.cpu_compiled as cc
import app.engines.inductor as ind
from app.repository.model_spec import ModelSpec
from app.repository.model_config import ModelConfig

def eager_compile(module, mode, shapes):
    ind.allow_recompiles(shapes)
    return torch.compile(module, backend="eager", dynamic=False)
cc.compile_module = eager_compile

def spec_for(postprocess="softmax"):
    cfg = ModelConfig.model_validate({"format": "python", "factory": "m:f", "input_shape": [1, 4, 4],
                                      "labels": ["a", "b", "c"], "postprocess": postprocess})
    from pathlib import Path
    return ModelSpec(name="m", folder=Path("/tmp"), config=cfg, class_names=("a", "b", "c"), version="1", config_file=Path("/tmp/model.toml"))

class Lin(nn.Module):
    def __init__(self): super().__init__(); torch.manual_seed(0); self.l = nn.Linear(16, 3)
    def forward(self, x): return self.l(x.reshape(x.shape[0], -1))

class Drop(Lin):  # dropout left in training mode: eager and compiled differ
    def forward(self, x): return torch.nn.functional.dropout(self.l(x.reshape(x.shape[0], -1)), 0.5, training=True)

class Log(Lin):  # NaN for some inputs: log of a negative
    def forward(self, x): return torch.log(self.l(x.reshape(x.shape[0], -1)))

buckets = (1, 2, 4, 8)
for cls, pp in ((Lin, "softmax"), (Drop, "softmax"), (Log, "none")):
    torch._dynamo.reset()
    m = cls().eval()
    engine = cc.cpu_compiled_engine(m, spec_for(pp), buckets, mode="reduce-overhead", strict=False, in_flight=2)
    print(cls.__name__, "engine:", engine.name, "fallback:", (engine.report.compile_fallback or "")[:120])
    before = dict(torch._dynamo.utils.counters["stats"])
    async def serve():
        for b in buckets:
            for dtype in ("uint8", "float32"):
                slot = engine.slots[0]
                await engine.run(slot, b, dtype)
    asyncio.run(serve())
    after = dict(torch._dynamo.utils.counters["stats"])
    print("   dynamo stats before serving:", before, " after:", after)
    engine.close()

"""Broken model folders a model author might write. Each entry: name -> function(folder) writing it."""
import json, shutil, textwrap
from pathlib import Path
import numpy as np, torch
import onnx
from onnx import helper, TensorProto
import sys; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import SEED
import models_runtime as M
sys.path.insert(0, "/tmp/rev-model")
from models.cnn import FashionCNN

LABELS = json.dumps([f"c{i}" for i in range(10)])

def toml(d, text): (d / "model.toml").write_text(textwrap.dedent(text))
def seed(d, extra="", drop=()):
    shutil.copy(SEED / "fashion_cnn.pt", d / "fashion_cnn.pt")
    lines = [l for l in (SEED / "model.toml").read_text().splitlines() if not any(l.startswith(k) for k in drop)]
    (d / "model.toml").write_text("\n".join(lines) + "\n" + extra)
def seed_top(d, extra):  # extra keys before [preprocess]
    shutil.copy(SEED / "fashion_cnn.pt", d / "fashion_cnn.pt")
    text = (SEED / "model.toml").read_text().replace("\n[preprocess]", "\n" + extra + "\n[preprocess]")
    (d / "model.toml").write_text(text)
def pymodel(d, body, extra="", shape="[1, 28, 28]", labels=LABELS):
    (d / "model.py").write_text(textwrap.dedent(body))
    lab = "" if labels in (None, "[]") else f"labels = {labels}\n"
    toml(d, f'format = "python"\nfactory = "model:build"\ninput_shape = {shape}\n{lab}{extra}')

def trained_cnn():
    m = FashionCNN(); m.load_state_dict(torch.load(SEED / "fashion_cnn.pt")); return m.eval()

def ts(d, extra="", shape="[1, 28, 28]", truncate=None, weights_untrained=False):
    m = FashionCNN().eval() if weights_untrained else trained_cnn()
    torch.jit.save(torch.jit.trace(m, torch.rand(2, 1, 28, 28)), str(d / "model.pt"))
    if truncate:
        b = (d / "model.pt").read_bytes(); (d / "model.pt").write_bytes(b[: int(len(b) * truncate)])
    toml(d, f'format = "torchscript"\nfile = "model.pt"\ninput_shape = {shape}\nlabels = {LABELS}\n{extra}')

def onnx_linear(d, *, opset=17, batch="N", n_inputs=1, in_type=TensorProto.FLOAT, out_shape_fixed=None,
                extra="", shape="[1, 28, 28]", truncate=None, reshape_batch=None):
    W = np.random.default_rng(1).standard_normal((784, 10)).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", in_type, [batch, 1, 28, 28])]
    nodes = []
    src = "x"
    if in_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT)); src = "xf"
    for i in range(1, n_inputs):
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [batch, 1, 28, 28]))
    flat = reshape_batch if reshape_batch is not None else 0
    nodes += [helper.make_node("Reshape", [src, "shp"], ["flat"]), helper.make_node("MatMul", ["flat", "W"], ["y"])]
    inits = [helper.make_tensor("shp", TensorProto.INT64, [2], [flat, 784]),
             helper.make_tensor("W", TensorProto.FLOAT, [784, 10], W.ravel().tolist())]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], inits)
    mdl = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    mdl.ir_version = 8 if opset <= 18 else 10
    raw = mdl.SerializeToString()
    if truncate: raw = raw[: int(len(raw) * truncate)]
    (d / "model.onnx").write_bytes(raw)
    toml(d, f'format = "onnx"\nfile = "model.onnx"\ninput_shape = {shape}\nlabels = {LABELS}\n{extra}')

def labels_file(d, n):
    seed(d, drop=("labels",), extra="")
    text = (d / "model.toml").read_text().replace("\n[preprocess]", '\nlabels = "labels.txt"\n[preprocess]')
    (d / "model.toml").write_text(text)
    (d / "labels.txt").write_text("\n".join(f"class {i}" for i in range(n)) + "\n")

B = {}
# ---- model.toml mistakes
B["shape-strings"] = lambda d: seed(d, drop=("input_shape",), extra="").__class__ or seed_top(d.__class__(d), "") 
B["shape-strings"] = lambda d: (seed(d, drop=("input_shape",)), (d/"model.toml").write_text((d/"model.toml").read_text().replace("\n[preprocess]", '\ninput_shape = ["1", "28", "28"]\n[preprocess]')))
B["shape-2d"] = lambda d: (seed(d, drop=("input_shape",)), (d/"model.toml").write_text((d/"model.toml").read_text().replace("\n[preprocess]", '\ninput_shape = [28, 28]\n[preprocess]')))
B["shape-zero"] = lambda d: (seed(d, drop=("input_shape",)), (d/"model.toml").write_text((d/"model.toml").read_text().replace("\n[preprocess]", '\ninput_shape = [1, 0, 28]\n[preprocess]')))
B["shape-neg"] = lambda d: (seed(d, drop=("input_shape",)), (d/"model.toml").write_text((d/"model.toml").read_text().replace("\n[preprocess]", '\ninput_shape = [1, -28, 28]\n[preprocess]')))
B["shape-3ch"] = lambda d: (seed(d, drop=("input_shape",)), (d/"model.toml").write_text((d/"model.toml").read_text().replace("\n[preprocess]", '\ninput_shape = [3, 28, 28]\n[preprocess]')))
B["shape-32"] = lambda d: (seed(d, drop=("input_shape",)), (d/"model.toml").write_text((d/"model.toml").read_text().replace("\n[preprocess]", '\ninput_shape = [1, 32, 32]\n[preprocess]')))
B["shape-float"] = lambda d: (seed(d, drop=("input_shape",)), (d/"model.toml").write_text((d/"model.toml").read_text().replace("\n[preprocess]", '\ninput_shape = [1, 28.0, 28]\n[preprocess]')))
B["unknown-key"] = lambda d: seed_top(d, "batch_size = 8")
B["unknown-pre-key"] = lambda d: seed(d, extra="mena = [0.5]\n")
B["bool-as-string"] = lambda d: seed_top(d, 'allow_random_weights = "yes"\nchannels_last = "no"')
B["labels-count"] = lambda d: labels_file(d, 9)
B["labels-file-dup-blank"] = lambda d: (labels_file(d, 10), (d/"labels.txt").write_text("a\n\nb\nc\nd\ne\nf\ng\nh\ni\nj\n"))
B["labels-empty-list"] = lambda d: (seed(d, drop=("labels",)), (d/"model.toml").write_text((d/"model.toml").read_text().replace("\n[preprocess]", '\nlabels = []\n[preprocess]')))
B["labels-outside"] = lambda d: (seed(d, drop=("labels",)), (d/"model.toml").write_text((d/"model.toml").read_text().replace("\n[preprocess]", '\nlabels = "../../etc/passwd"\n[preprocess]')))
B["dtype-fp16"] = lambda d: seed_top(d, 'dtype = "fp16"')
B["engine-cudagraph"] = lambda d: seed_top(d, 'engine = "cuda-graph"')
B["engine-compile"] = lambda d: seed_top(d, 'engine = "compile"')
B["buckets-zero"] = lambda d: seed_top(d, 'buckets = [0, 4]')
B["buckets-huge"] = lambda d: seed_top(d, 'buckets = [100000000]')
B["buckets-string"] = lambda d: seed_top(d, 'buckets = "1,2,x"')
B["max-delay-neg"] = lambda d: seed_top(d, 'max_delay_ms = -1')
B["mean-wrong-len"] = lambda d: seed(d, extra="mean = [0.5, 0.5, 0.5]\nstd = [0.2, 0.2, 0.2]\n")
B["std-zero"] = lambda d: seed(d, extra="std = [0]\n")
B["vp-zero"] = lambda d: seed_top(d, 'version_policy = { latest = { num_versions = 0 } }')
B["vp-specific-missing"] = lambda d: seed_top(d, 'version_policy = { specific = { versions = [7] } }')
B["toml-bad"] = lambda d: (d / "model.toml").write_text('format = "python"\ninput_shape = [1, 28, 28\n')
B["toml-latin1"] = lambda d: (d / "model.toml").write_bytes('format = "python" # caf\xe9\n'.encode("latin-1"))
B["no-toml"] = lambda d: (d / "README").write_text("forgot model.toml")
B["weights-missing"] = lambda d: (seed(d), (d / "fashion_cnn.pt").unlink())
B["weights-truncated"] = lambda d: (seed(d), (d / "fashion_cnn.pt").write_bytes((SEED / "fashion_cnn.pt").read_bytes()[:5000]))
B["weights-wrong-model"] = lambda d: (seed(d), torch.save({"w": torch.zeros(3)}, d / "fashion_cnn.pt"))
# silently ignored keys: torchscript with weights (trained weights never loaded), python with file
B["ts-with-weights-ignored"] = lambda d: (ts(d, weights_untrained=True, extra='weights = "fashion_cnn.pt"\n'), shutil.copy(SEED / "fashion_cnn.pt", d / "fashion_cnn.pt"))
B["python-with-arguments"] = lambda d: seed_top(d, 'arguments = { num_classes = 5 }\narchitecture = "resnet50"\nproviders = ["CUDAExecutionProvider"]')
# ---- python models at load
B["py-factory-missing"] = lambda d: pymodel(d, "def other(): pass\n")
B["py-module-missing"] = lambda d: toml(d, f'format = "python"\nfactory = "nosuchmod:build"\ninput_shape = [1, 28, 28]\nlabels = {LABELS}\n')
B["py-factory-raises"] = lambda d: pymodel(d, "def build():\n    raise RuntimeError('cannot find my checkpoint /data/x.ckpt')\n")
B["py-import-syntax"] = lambda d: pymodel(d, "def build(:\n")
B["py-returns-fn"] = lambda d: pymodel(d, "def build():\n    return lambda x: x\n")
B["py-sysexit-load"] = lambda d: pymodel(d, "import sys\ndef build():\n    sys.exit(0)\n")
B["py-sysexit-import"] = lambda d: pymodel(d, "import sys\nsys.exit(2)\ndef build(): pass\n")
B["py-returns-dict"] = lambda d: pymodel(d, M.body("return {'a': y}"))
B["py-outputs-missing-name"] = lambda d: pymodel(d, M.body("return {'logits': y, 'emb': y}"), extra='postprocess = "none"\n[[outputs]]\nname = "logits"\nclasses = true\n[[outputs]]\nname = "embedding"\n')
B["py-prob-fails"] = lambda d: pymodel(d, M.body("raise ValueError('expects 3 channels')"))
B["py-wrong-batch-probe"] = lambda d: pymodel(d, M.body("return y[:1]"))
B["py-1d"] = lambda d: pymodel(d, M.body("return y.sum(1)"))
B["py-complex"] = lambda d: pymodel(d, M.body("return torch.complex(y, y)"), extra="")
B["py-outputs-complex"] = lambda d: pymodel(d, M.body("return {'z': torch.complex(y, y)}"), extra='postprocess="none"\n[[outputs]]\nname="z"\n', labels='"x"'.replace('"x"', '[]'))
B["py-outputs-huge-int"] = lambda d: pymodel(d, M.body("return {'ids': (y.abs() * 1e9).long()}"), extra='postprocess="none"\n[[outputs]]\nname="ids"\n', labels="[]")
B["py-outputs-labels-none"] = lambda d: pymodel(d, M.body("return {'emb': y}"), extra='[[outputs]]\nname="emb"\n', labels="[]")
B["py-huge-output"] = lambda d: pymodel(d, M.body("return y.repeat(1, 1_000_000)"), extra='postprocess="none"\n[[outputs]]\nname="big"\n', labels="[]")
# ---- torchscript / onnx files
B["ts-truncated"] = lambda d: ts(d, truncate=0.5)
B["ts-empty"] = lambda d: ts(d, truncate=1e-9)
B["ts-is-state-dict"] = lambda d: (ts(d), shutil.copy(SEED / "fashion_cnn.pt", d / "model.pt"))
B["ts-wrong-shape"] = lambda d: ts(d, shape="[1, 32, 32]")
B["onnx-ok"] = lambda d: onnx_linear(d)
B["onnx-truncated"] = lambda d: onnx_linear(d, truncate=0.5)
B["onnx-opset-99"] = lambda d: onnx_linear(d, opset=99)
B["onnx-two-inputs"] = lambda d: onnx_linear(d, n_inputs=2)
B["onnx-uint8-input"] = lambda d: onnx_linear(d, in_type=TensorProto.UINT8)
B["onnx-fp16-input"] = lambda d: onnx_linear(d, in_type=TensorProto.FLOAT16)
B["onnx-fixed-batch-1"] = lambda d: onnx_linear(d, batch=1)
B["onnx-fixed-batch-2"] = lambda d: onnx_linear(d, batch=2)
B["onnx-baked-reshape-2"] = lambda d: onnx_linear(d, reshape_batch=2)
B["onnx-wrong-shape"] = lambda d: onnx_linear(d, shape="[1, 32, 32]")
def _onnx_out_missing(d):
    onnx_linear(d)
    toml(d, 'format = "onnx"\nfile = "model.onnx"\ninput_shape = [1, 28, 28]\npostprocess = "none"\n[[outputs]]\nname = "logits"\n')
B["onnx-output-name-missing"] = _onnx_out_missing
B["onnx-engine-eager"] = lambda d: onnx_linear(d, extra='engine = "eager"\n')
B["onnx-provider-cuda"] = lambda d: onnx_linear(d, extra='providers = ["CUDAExecutionProvider"]\n')
B["torchvision-cpu"] = lambda d: toml(d, f'format = "torchvision"\narchitecture = "resnet18"\nallow_random_weights = true\ninput_shape = [3, 64, 64]\nlabels = {json.dumps([str(i) for i in range(1000)])}\n')
B["torchvision-arch-typo"] = lambda d: toml(d, f'format = "torchvision"\narchitecture = "resnet5O"\nallow_random_weights = true\ninput_shape = [3, 64, 64]\nlabels = {LABELS}\n')
def _versions_missing(d):
    for v in ("1", "2"):
        (d / v).mkdir(); shutil.copy(SEED / "fashion_cnn.pt", d / v / "fashion_cnn.pt")
    (d / "model.toml").write_text((SEED / "model.toml").read_text().replace("\n[preprocess]", "\nversion_policy = { specific = { versions = [3] } }\n[preprocess]"))
B["versions-specific-missing"] = _versions_missing
B["input-datatype-fp16"] = lambda d: seed_top(d, 'input_datatype = "FP16"')
B["labels-blank-line"] = lambda d: (labels_file(d, 10), (d/"labels.txt").write_text("zero\n\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n"))

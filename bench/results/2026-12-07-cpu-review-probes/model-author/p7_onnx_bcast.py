"""P7: an ONNX model whose output has 1 row for batches of 4+ (2 rows at the probe's batch of 2)."""
import sys; sys.path.insert(0, "/tmp/rev-model-probes")
from kit import *
import numpy as np, onnx
from onnx import helper, TensorProto as T
port = int(sys.argv[1]) if len(sys.argv) > 1 else 18616
repo = fresh_repo("p7")
W = np.random.default_rng(1).standard_normal((784, 10)).astype(np.float32)
nodes = [
    helper.make_node("Reshape", ["x", "shp"], ["flat"]), helper.make_node("MatMul", ["flat", "W"], ["y"]),
    helper.make_node("Shape", ["y"], ["s"], end=1), helper.make_node("Greater", ["s", "three"], ["big"]),
    helper.make_node("Cast", ["big"], ["bigi"], to=T.INT64), helper.make_node("Sub", ["two", "bigi"], ["ends"]),
    helper.make_node("Slice", ["y", "zero", "ends", "axis0"], ["out"]),
]
inits = [helper.make_tensor("shp", T.INT64, [2], [0, 784]), helper.make_tensor("W", T.FLOAT, [784, 10], W.ravel().tolist()),
         helper.make_tensor("three", T.INT64, [1], [3]), helper.make_tensor("two", T.INT64, [1], [2]),
         helper.make_tensor("zero", T.INT64, [1], [0]), helper.make_tensor("axis0", T.INT64, [1], [0])]
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["N", 1, 28, 28])],
                      [helper.make_tensor_value_info("out", T.FLOAT, [None, 10])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 8
for post in ("softmax", "none"):
    d = repo / f"onnx-{post}"; d.mkdir()
    (d / "model.onnx").write_bytes(m.SerializeToString())
    (d / "model.toml").write_text(f'format = "onnx"\nfile = "model.onnx"\ninput_shape = [1, 28, 28]\npostprocess = "{post}"\nlabels = {[f"c{i}" for i in range(10)]}\n'.replace("'", '"'))
s = Server(repo, port)
print("ready", s.wait_ready(120, "/readyz"))
for post in ("softmax", "none"):
    imgs = u8(3, seed=3)
    r = predict(s.url, f"onnx-{post}", imgs)
    x = imgs.reshape(3, -1).astype(np.float32) / 255; y = x @ W
    print(post, r.status_code, [p["label"] for p in r.json()["predictions"]] if r.status_code == 200 else r.text[:200],
          "expected labels", y.argmax(1).tolist(), "| rows identical:", r.status_code == 200 and len({str(p["scores"]) for p in r.json()["predictions"]}) == 1)
s.stop()

"""Write small ONNX files: onnx2/model.onnx (outputs logits (N,3), emb (N,16), count (N,)), and fixed-batch variants."""
import sys, numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper

def build(path, batch="N"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 4, 4])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3])
    emb = helper.make_tensor_value_info("emb", TensorProto.FLOAT, [batch, 16])
    count = helper.make_tensor_value_info("count", TensorProto.FLOAT, [batch])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Flatten", ["x"], ["emb"], axis=1),
        helper.make_node("MatMul", ["emb", "w"], ["logits"]),
        helper.make_node("ReduceSum", ["emb", "axes"], ["count"], keepdims=0),
    ]
    g = helper.make_graph(nodes, "g", [x], [logits, emb, count], [w, numpy_helper.from_array(np.array([1], np.int64), "axes")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)

build(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "N" else "N")
if len(sys.argv) > 2 and sys.argv[2] != "N":
    build(sys.argv[1], int(sys.argv[2]))

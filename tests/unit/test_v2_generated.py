"""app/protocols/v2/proto's Python modules are exactly what grpcio-tools makes of the .proto beside them."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO = "app/protocols/v2/proto/grpc_predict_v2.proto"


def test_the_generated_modules_match_the_proto(tmp_path: Path) -> None:
    (tmp_path / PROTO).parent.mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    args = ["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    assert protoc.main([*args, f"--grpc_python_out={tmp_path}", str(tmp_path / PROTO)]) == 0
    for name in ("grpc_predict_v2_pb2.py", "grpc_predict_v2_pb2.pyi", "grpc_predict_v2_pb2_grpc.py"):
        made = (tmp_path / "app/protocols/v2/proto" / name).read_text()
        assert made == (ROOT / "app/protocols/v2/proto" / name).read_text(), (
            f"{name} is stale: regenerate it (see the .proto)"
        )

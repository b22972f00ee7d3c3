"""Start-up failures through the real command line: one clear line each, a non-zero exit, no traceback.

Everything here fails before the server listens (never after "Application startup"), except
the worker whose engine cannot be built, which must take the whole multi-worker server down.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from models.cnn import WEIGHTS_PATH
from tests.integration.server_process import ROOT, free_port, running_server

SEED_TOML = f"""
format = "python"
factory = "model:build"
weights = "{WEIGHTS_PATH.name}"
input_shape = [1, 28, 28]
labels = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]
"""


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "CGSERVE_HOST": "127.0.0.1", "CGSERVE_PORT": str(free_port()), **env}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )


def assert_one_clear_failure(result: subprocess.CompletedProcess[str], status: int, *words: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == status, output
    assert "Traceback" not in output and "Application startup" not in output, output
    for word in words:
        assert word in output, output


def repository(tmp_path: Path, model_py: str) -> Path:
    folder = tmp_path / "repository" / "seed"
    folder.mkdir(parents=True)
    (folder / "model.toml").write_text(SEED_TOML)
    (folder / "model.py").write_text(model_py)
    shutil.copy(WEIGHTS_PATH, folder / WEIGHTS_PATH.name)  # a model's files lie inside its folder
    return folder.parent


def test_corrupt_weights_stop_start_up_naming_the_file_and_key(tmp_path: Path) -> None:
    root = repository(tmp_path, "from models.cnn import FashionCNN\n\ndef build():\n    return FashionCNN()\n")
    (root / "seed" / "bad.pt").write_bytes(b"not a state dict")
    toml = root / "seed" / "model.toml"
    toml.write_text(SEED_TOML.replace(WEIGHTS_PATH.name, "bad.pt"))
    result = cli("serve", "--model-repository", str(root))
    assert_one_clear_failure(result, 2, f"{toml}: weights: bad.pt")


SEED_PY = "from models.cnn import FashionCNN\n\ndef build():\n    return FashionCNN()\n"


@pytest.mark.parametrize("exit_call", ["builtins:exit", "model:leave"])
def test_a_model_whose_code_exits_stops_start_up_with_a_non_zero_status(tmp_path: Path, exit_call: str) -> None:
    # exit() or sys.exit(0) in a model's code is a SystemExit: it must not end the server with status 0.
    root = repository(tmp_path, SEED_PY + "\ndef leave():\n    raise SystemExit(0)\n")
    toml = root / "seed" / "model.toml"
    toml.write_text(SEED_TOML.replace("model:build", exit_call))
    assert_one_clear_failure(cli("serve", "--model-repository", str(root)), 2, f"{toml}: factory: SystemExit")


def test_a_labels_file_outside_the_model_folder_stops_start_up(tmp_path: Path) -> None:
    root = repository(tmp_path, SEED_PY)
    (tmp_path / "secret.txt").write_text("\n".join(f"secret {i}" for i in range(10)))
    toml = root / "seed" / "model.toml"
    labels = 'labels = "../../secret.txt"'
    toml.write_text(SEED_TOML.replace('labels = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]', labels))
    result = cli("serve", "--model-repository", str(root))
    assert_one_clear_failure(result, 2, f"{toml}: labels: '../../secret.txt'", "out of the model's folder")
    assert "secret 1" not in result.stderr


def test_a_model_folder_name_ending_in_a_newline_stops_start_up(tmp_path: Path) -> None:
    root = repository(tmp_path, SEED_PY)
    (root / "seed").rename(root / "evil\n")
    assert_one_clear_failure(cli("serve", "--model-repository", str(root)), 2, "a model's name 'evil\\n'")


def test_a_port_in_use_fails_before_any_model_is_served() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = cli("serve", "--port", port, "--device", "cpu")
    assert_one_clear_failure(result, 1, f"cannot listen on 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("serve", "--device", "cuda"), "torch sees no CUDA device"),
        (("serve", "--device", "cpu", "--dtype", "fp16"), "fp16 needs a CUDA device"),
        (("serve", "--dtype", "fp16"), "fp16 needs a CUDA device"),
        (("debug-dump",), "torch sees no CUDA device"),
    ],
    ids=["cuda-asked", "fp16-on-cpu-setting", "fp16-on-auto-cpu", "debug-dump"],
)
def test_gpu_only_requests_on_a_machine_without_cuda_are_refused_in_one_line(args: tuple[str, ...], words: str) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_one_clear_failure(cli(*args), 2, words)


def test_help_lists_every_setting_without_importing_torch() -> None:
    from app.config import Settings

    helped = cli("serve", "--help")
    assert helped.returncode == 0
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')}" in helped.stdout and f"CGSERVE_{name.upper()}" in helped.stdout
    probe = "import sys, app.cli\ntry:\n    app.cli.main(['serve', '--help'])\nexcept SystemExit:\n    pass\n"
    probe += "print('torch imported' if 'torch' in sys.modules else 'torch not imported', file=sys.stderr)"
    quiet = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert quiet.stderr.strip().endswith("torch not imported")
    assert cli("--version").stdout.startswith("cudagraph-serve ")


def test_a_worker_whose_start_up_fails_stops_the_whole_server(tmp_path: Path) -> None:
    # Builds in the CLI's own check, fails in every worker process uvicorn spawns.
    model_py = (
        "import multiprocessing\nfrom models.cnn import FashionCNN\n\ndef build():\n"
        "    if multiprocessing.parent_process() is not None:\n"
        "        raise RuntimeError('this worker cannot build the model')\n"
        "    return FashionCNN()\n"
    )
    root = repository(tmp_path, model_py)
    with (
        # make reports its command's status 1 as "Error 1" and exits 2 itself.
        pytest.raises(RuntimeError, match=r"exited with 2(.|\n)*this worker cannot build(.|\n)*serve\] Error 1"),
        running_server(tmp_path / "failed.log", workers="2", model_repository=str(root)),
    ):
        pass

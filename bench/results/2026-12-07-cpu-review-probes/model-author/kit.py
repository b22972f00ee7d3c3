"""Helpers: build a model repository, start/stop a real server, send requests."""
import os, shutil, signal, subprocess, sys, time, json, textwrap
from pathlib import Path
import httpx

ROOT = Path("/tmp/rev-model")
PY = str(ROOT / ".venv/bin/python")
SEED = ROOT / "models/repository/fashion-cnn"

def good_model(repo: Path, name="good"):
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(SEED / "fashion_cnn.pt", d / "fashion_cnn.pt")
    (d / "model.toml").write_text((SEED / "model.toml").read_text())
    return d

def py_model(repo: Path, name: str, body: str, toml_extra: str = "", input_shape="[1, 28, 28]", labels=10, toml=None):
    d = repo / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.py").write_text(textwrap.dedent(body))
    if toml is None:
        toml = (f'format = "python"\nfactory = "model:build"\ninput_shape = {input_shape}\n'
                f'labels = {json.dumps([f"c{i}" for i in range(labels)])}\n' + toml_extra)
    (d / "model.toml").write_text(toml)
    return d

def fresh_repo(tag: str) -> Path:
    repo = Path(f"/tmp/rev-model-{tag}")
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir()
    return repo

class Server:
    def __init__(self, repo: Path, port: int, **env):
        self.repo, self.port = repo, port
        e = dict(os.environ)
        e.update({"CGSERVE_MODEL_REPOSITORY": str(repo), "CGSERVE_DEVICE": "cpu", "CGSERVE_HOST": "127.0.0.1",
                  "CGSERVE_PORT": str(port), "CGSERVE_GRPC_PORT": "0"})
        e.update({k if k.startswith("CGSERVE_") else "CGSERVE_" + k.upper(): str(v) for k, v in env.items()})
        self.log = open(f"/tmp/rev-model-probes/server-{port}.log", "w")
        self.proc = subprocess.Popen([PY, "-m", "app.cli", "serve"], cwd=ROOT, env=e, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout=120, ready_path="/healthz"):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                return False
            try:
                r = httpx.get(self.url + ready_path, timeout=2)
                if r.status_code == 200:
                    return True
            except Exception:
                pass
            time.sleep(0.3)
        return False

    def logtext(self):
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()

def u8(n=1, shape=(1, 28, 28), seed=0):
    import numpy as np
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)

def predict(url, model, images, timeout=30, **kw):
    return httpx.post(f"{url}/v1/models/{model}/predict", content=images.tobytes(),
                      headers={"content-type": "application/octet-stream"}, timeout=timeout, **kw)

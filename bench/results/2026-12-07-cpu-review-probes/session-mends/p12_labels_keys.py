"""p12: labels files (CRLF, trailing blanks, whitespace-only line, BOM) and FORMAT_KEYS, through read_model_config/read_labels."""
import tempfile
from pathlib import Path
from app.repository.model_config import read_model_config, read_labels, ModelConfigError

def labels(text: bytes):
    d = Path(tempfile.mkdtemp(prefix="rev62-labels-"))
    (d / "labels.txt").write_bytes(text)
    (d / "model.toml").write_text('format = "torchscript"\nfile = "labels.txt"\ninput_shape = [1, 4, 4]\nlabels = "labels.txt"\n')
    try:
        config = read_model_config(d / "model.toml")
        return read_labels(config, (d,), d / "model.toml")
    except ModelConfigError as e:
        return "ERROR " + str(e).split(": labels: ")[-1][:120]

for name, text in [("crlf", b"a\r\nb\r\nc\r\n"), ("trailing blanks", b"a\nb\nc\n\n\n  \n"), ("blank middle", b"a\n\nc\n"),
                   ("spaces-only middle", b"a\n   \nc\n"), ("bom", b"\xef\xbb\xbfa\nb\n"), ("leading blank", b"\na\nb\n")]:
    print(f"{name:20s}", labels(text))

def keys(toml: str):
    d = Path(tempfile.mkdtemp(prefix="rev62-keys-"))
    (d / "m.pt").write_bytes(b"x")
    (d / "model.toml").write_text(toml)
    try:
        read_model_config(d / "model.toml"); return "ok"
    except ModelConfigError as e:
        return "ERROR " + "; ".join(p.split("model.toml: ")[-1][:100] for p in e.problems)

base = 'input_shape = [1, 4, 4]\nlabels = ["a"]\n'
for toml in ['format = "torchscript"\nfile = "m.pt"\nweights = "m.pt"\n', 'format = "python"\nfactory = "m:f"\narguments = {}\n',
             'format = "onnx"\nfile = "m.pt"\nproviders = ["CPUExecutionProvider"]\n', 'format = "torchscript"\nfile = "m.pt"\nproviders = ["CPUExecutionProvider"]\n',
             'format = "torchvision"\narchitecture = "resnet18"\nallow_random_weights = false\nweights = "m.pt"\n',
             'format = "exported"\nfile = "m.pt"\nallow_random_weights = false\n']:
    print(toml.replace("\n", " | ")[:90].ljust(92), keys(toml + base))

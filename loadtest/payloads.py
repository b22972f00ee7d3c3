"""Request bodies built from real Fashion-MNIST test images, encoded once before a run.

Six forms, as the service accepts them:
  json  {"instances": [[784 floats in [0, 1]], ...]}      application/json
  png   one 28×28 grayscale PNG in multipart field `file`  multipart/form-data
  raw   N×28×28 uint8 (or float32 in [0, 1], ?dtype=float32) application/octet-stream
  v2    the Open Inference Protocol's infer request, one UINT8 tensor [N, 1, 28, 28]: over HTTP the
        binary tensor extension (a JSON header, then the pixels; the answer's probabilities in JSON),
        over gRPC a ModelInferRequest with the pixels as raw_input_contents (loadtest/grpc_driver.py)
  photo one 500×375 photo-like JPEG in field `file`        multipart/form-data (labels not checked:
        what a camera client sends; the server decodes and resizes it to the model's input)
  jpeg  the same photos, each the whole body                 image/jpeg

Each body carries the labels the eager model gives its images on the CPU (not the data set's
ground truth: the model is ~90% right, and the server must agree with the model, not the data).
Images whose two best logits are closer than `min_margin` are left out, so that a different
but correct float path on the server (TF32 convolutions, fp16, another summation order) cannot
flip a label and be counted as a wrong answer.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

FORMS = ("json", "png", "raw", "photo", "jpeg", "v2")
V2_PATH = "/v2/models/fashion-cnn/infer"  # the v2 form's path where --path is left at /predict
RAW_DTYPES = ("uint8", "float32")
# A fixed boundary: the bodies are built once, and it cannot occur inside a PNG's bytes by
# chance often enough to matter (each body is checked anyway).
MULTIPART_BOUNDARY = "cgserve-loadtest-5f1d2c"
MULTIPART_CONTENT_TYPE = f"multipart/form-data; boundary={MULTIPART_BOUNDARY}"
DEFAULT_MIN_MARGIN = 0.5  # logits; see the module docstring


@dataclass(frozen=True)
class Payloads:
    form: str
    path: str  # request path with its query, e.g. "/predict?dtype=float32"
    content_type: str
    bodies: tuple[bytes, ...]
    expected: tuple[tuple[int, ...], ...] | None  # eager labels per body; None: not checked
    images_per_request: int
    info: dict[str, Any] = field(default_factory=dict)  # what the record says about the payloads
    headers: tuple[tuple[str, str], ...] = ()  # sent with every body besides Content-Type
    # The v2 form: each body's uint8 pixels and one image's (C, H, W), from which gRPC builds its messages.
    pixels: tuple[bytes, ...] = ()
    image_shape: tuple[int, int, int] = (1, 28, 28)

    @property
    def model(self) -> str:
        """The model a v2 path names (/v2/models/<model>[/versions/<v>]/infer)."""
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) < 4 or parts[:2] != ["v2", "models"] or parts[-1] != "infer":
            raise ValueError(f"the v2 form's path is /v2/models/<model>/infer, got {self.path!r}")
        return parts[2]


def to_unit_float(images: np.ndarray) -> np.ndarray:
    """uint8 (N, 28, 28) → float32 (N, 28, 28) in [0, 1], bit for bit what app.codecs.bodies makes of
    raw and PNG bodies (a multiply by float32(1/255), which can differ from a divide by one ulp)."""
    return images.astype(np.float32) * np.float32(1 / 255)


def encode_json(images: np.ndarray) -> bytes:
    """uint8 (k, 28, 28) → {"instances": [[784 floats], ...]}.

    orjson writes float32 values in their shortest round-tripping form, so the server parses
    back exactly the float32 pixels the reference labels were computed on.
    """
    flat = to_unit_float(images).reshape(len(images), -1)  # (k, 784)
    return orjson.dumps({"instances": flat}, option=orjson.OPT_SERIALIZE_NUMPY)


def encode_raw(images: np.ndarray, dtype: str) -> bytes:
    """uint8 (k, 28, 28) → k×28×28 bytes, uint8 as-is or float32 in [0, 1] (little-endian)."""
    if dtype == "uint8":
        return np.ascontiguousarray(images, dtype=np.uint8).tobytes()
    if dtype == "float32":
        return to_unit_float(images).astype("<f4").tobytes()
    raise ValueError(f"raw dtype must be one of {RAW_DTYPES}, got {dtype!r}")


def v2_header(shape: tuple[int, ...], pixel_bytes: int) -> bytes:
    """The JSON header of a binary-tensor v2 infer request carrying `pixel_bytes` of UINT8 `shape`; the answer's
    probabilities asked for in JSON (ten floats an image: the client parses no binary output)."""
    tensor = {
        "name": "input",
        "datatype": "UINT8",
        "shape": list(shape),
        "parameters": {"binary_data_size": pixel_bytes},
    }
    return orjson.dumps({"inputs": [tensor], "outputs": [{"name": "probabilities"}]})


def v2_payloads(
    pixels: tuple[bytes, ...],
    image_shape: tuple[int, int, int],
    k: int,
    path: str,
    expected: tuple[tuple[int, ...], ...] | None,
    info: dict[str, Any],
) -> Payloads:
    """Bodies of the v2 form: each a header and its images' pixels, sent as the binary tensor extension."""
    header = v2_header((k, *image_shape), len(pixels[0]))
    bodies = tuple(header + p for p in pixels)
    path = V2_PATH if path == "/predict" else path
    headers = (("Inference-Header-Content-Length", str(len(header))),)
    info = info | {"bodies": len(bodies), "body_bytes_mean": round(float(np.mean([len(b) for b in bodies])), 1)}
    payloads = Payloads("v2", path, "application/octet-stream", bodies, expected, k, info, headers, pixels, image_shape)
    info["model"] = payloads.model  # a path that names no model fails here, before the run
    return payloads


def encode_png(image: np.ndarray) -> bytes:
    """uint8 (28, 28) → a lossless 8-bit grayscale PNG."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), mode="L").save(buf, format="PNG")
    return buf.getvalue()


def multipart_body(data: bytes, *, filename: str, content_type: str) -> bytes:
    """One file in field `file` as a complete multipart/form-data body, encoded by httpx with
    MULTIPART_BOUNDARY (given in the Content-Type, httpx uses it), so every body shares one header."""
    if MULTIPART_BOUNDARY.encode() in data:
        raise ValueError("the multipart boundary occurs inside the file; change MULTIPART_BOUNDARY")
    request = httpx.Request(
        "POST",
        "http://127.0.0.1/predict",  # never sent: only the encoded body is kept
        files={"file": (filename, data, content_type)},
        headers={"content-type": MULTIPART_CONTENT_TYPE},
    )
    body = request.read()
    if not body.startswith(f"--{MULTIPART_BOUNDARY}\r\n".encode()):  # an httpx that ignores the header's
        raise RuntimeError("httpx encoded the body with a boundary of its own, not MULTIPART_BOUNDARY")
    return body


def load_images(limit: int | None = None) -> np.ndarray:
    """The shipped real test images, uint8 (N, 28, 28), at most `limit` of them."""
    from models.fashion_mnist import load_test_sample

    images, _ = load_test_sample()
    return images[:limit] if limit else images


def reference_logits(images: np.ndarray, weights: Path | str | None = None) -> np.ndarray:
    """float32 (N, 10) logits of the eager model on the CPU for uint8 images (N, 28, 28)."""
    import torch

    from models.cnn import WEIGHTS_PATH, load_model

    model = load_model(weights or WEIGHTS_PATH, device="cpu")
    x = torch.from_numpy(to_unit_float(images)).unsqueeze(1)  # (N, 1, 28, 28)
    with torch.inference_mode():
        logits: np.ndarray = model(x).numpy()
    return logits


def top2_margin(logits: np.ndarray) -> np.ndarray:
    """float (N,) gap between the best and second-best logit of (N, C) logits."""
    top2 = np.sort(logits, axis=1)[:, -2:]
    margin: np.ndarray = top2[:, 1] - top2[:, 0]
    return margin


def build_payloads(
    form: str,
    *,
    images_per_request: int = 1,
    raw_dtype: str = "uint8",
    check_labels: bool = True,
    weights: Path | str | None = None,
    min_margin: float = DEFAULT_MIN_MARGIN,
    limit: int | None = None,
    path: str = "/predict",
    image_shape: tuple[int, int, int] | None = None,
) -> Payloads:
    """All bodies of one form, each with the eager labels of its images (see module doc).

    `image_shape` (C, H, W) other than the seed CNN's: raw bodies of random pixels for another
    model of the repository (e.g. resnet50's 3×224×224), its labels not checked."""
    if form in ("photo", "jpeg"):
        return photo_payloads(path, multipart=form == "photo")
    if image_shape is not None and tuple(image_shape) != (1, 28, 28):
        return random_raw_payloads(image_shape, images_per_request, path, v2=form == "v2")
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if images_per_request < 1:
        raise ValueError(f"images per request must be ≥ 1, got {images_per_request}")
    if form == "v2" and raw_dtype != "uint8":
        raise ValueError(
            "the v2 form sends UINT8 pixels, as the models' metadata declares; --raw-dtype is the raw form's"
        )
    if form == "png" and images_per_request != 1:
        raise ValueError("the png form carries one image per request; use --batch 1")
    images = load_images(limit)
    info: dict[str, Any] = {"source": "models/fashion_mnist_test_sample.npz", "images_loaded": len(images)}
    labels = None
    if check_labels:
        logits = reference_logits(images, weights)
        keep = top2_margin(logits) >= min_margin
        images, labels = images[keep], logits[keep].argmax(1)
        info |= {
            "label_reference": f"eager CPU model, weights {weights or 'models/repository/fashion-cnn/fashion_cnn.pt'}",
            "min_margin_logits": min_margin,
            "images_left_out_ambiguous": int((~keep).sum()),
        }
    k = images_per_request
    n_bodies = len(images) // k
    if n_bodies == 0:
        raise ValueError(f"{len(images)} images cannot fill one request of {k}")
    groups = [images[i * k : (i + 1) * k] for i in range(n_bodies)]  # each (k, 28, 28)
    expected = None
    if labels is not None:
        expected = tuple(tuple(int(v) for v in labels[i * k : (i + 1) * k]) for i in range(n_bodies))

    if form == "v2":
        return v2_payloads(tuple(encode_raw(g, "uint8") for g in groups), (1, 28, 28), k, path, expected, info)
    if form == "json":
        bodies = tuple(encode_json(g) for g in groups)
        content_type = "application/json"
    elif form == "raw":
        bodies = tuple(encode_raw(g, raw_dtype) for g in groups)
        content_type = "application/octet-stream"
        if raw_dtype != "uint8":
            path = f"{path}?dtype={raw_dtype}"
        info["raw_dtype"] = raw_dtype
    else:
        bodies = tuple(
            multipart_body(encode_png(g[0]), filename=f"fmnist-{i}.png", content_type="image/png")
            for i, g in enumerate(groups)
        )
        content_type = MULTIPART_CONTENT_TYPE
    info |= {
        "images_used": n_bodies * k,
        "bodies": n_bodies,
        "body_bytes_mean": round(float(np.mean([len(b) for b in bodies])), 1),
    }
    return Payloads(
        form=form,
        path=path,
        content_type=content_type,
        bodies=bodies,
        expected=expected,
        images_per_request=k,
        info=info,
    )


def random_raw_payloads(
    shape: tuple[int, int, int], images_per_request: int, path: str, bodies: int = 16, *, v2: bool = False
) -> Payloads:
    """Raw uint8 bodies of `images_per_request` random (C, H, W) images each, seeded (or v2's of the same)."""
    rng = np.random.default_rng(0)
    encoded = tuple(rng.integers(0, 256, (images_per_request, *shape), dtype=np.uint8).tobytes() for _ in range(bodies))
    info = {"source": f"random uint8 pixels, {'×'.join(map(str, shape))} per image, seed 0"}
    if v2:
        return v2_payloads(encoded, shape, images_per_request, path, None, info)
    return Payloads("raw", path, "application/octet-stream", encoded, None, images_per_request, info)


def photo_payloads(
    path: str, bodies: int = 16, width: int = 500, height: int = 375, *, multipart: bool = True
) -> Payloads:
    """`bodies` photo-like JPEGs (loadtest/photos.py, quality 90), seeded: multipart uploads, or each the
    whole body."""
    from PIL import Image

    from loadtest.photos import synthetic_photo

    encoded = []
    for seed in range(bodies):
        buffer = io.BytesIO()
        Image.fromarray(synthetic_photo(width, height, seed)).save(buffer, format="JPEG", quality=90)
        jpeg = buffer.getvalue()
        encoded.append(
            multipart_body(jpeg, filename=f"photo-{seed}.jpg", content_type="image/jpeg") if multipart else jpeg
        )
    info = {"source": f"synthetic photos {width}×{height}, JPEG quality 90, seeds 0-{bodies - 1}",
            "body_bytes_mean": round(float(np.mean([len(b) for b in encoded])), 1)}  # fmt: skip
    if multipart:
        return Payloads("photo", path, MULTIPART_CONTENT_TYPE, tuple(encoded), None, 1, info)
    return Payloads("jpeg", path, "image/jpeg", tuple(encoded), None, 1, info)


@dataclass(frozen=True)
class PayloadOptions:
    """What to send, as the CLI takes it; `build()` encodes the bodies."""

    form: str = "json"
    batch: int = 1  # images per request (json and raw)
    raw_dtype: str = "uint8"
    check_labels: bool = True
    weights: str | None = None  # for the reference labels; None: models/repository/fashion-cnn/fashion_cnn.pt
    min_margin: float = DEFAULT_MIN_MARGIN
    images: int | None = None  # use the first N shipped images; None: all 1000
    path: str = "/predict"
    image_shape: tuple[int, int, int] | None = None  # another model's (C, H, W): random raw pixels

    def build(self) -> Payloads:
        return build_payloads(
            self.form,
            images_per_request=self.batch,
            raw_dtype=self.raw_dtype,
            check_labels=self.check_labels,
            weights=self.weights,
            min_margin=self.min_margin,
            limit=self.images,
            path=self.path,
            image_shape=self.image_shape,
        )

    def to_args(self) -> list[str]:
        """The CLI flags that reproduce these options."""
        args = ["--form", self.form]
        if self.batch != 1:
            args += ["--batch", str(self.batch)]
        if self.form == "raw" and self.raw_dtype != "uint8":
            args += ["--raw-dtype", self.raw_dtype]
        if not self.check_labels:
            args.append("--no-check-labels")
        if self.weights:
            args += ["--weights", str(self.weights)]
        if self.min_margin != DEFAULT_MIN_MARGIN:
            args += ["--min-margin", f"{self.min_margin:g}"]
        if self.images:
            args += ["--images", str(self.images)]
        if self.path != "/predict":
            args += ["--path", self.path]
        if self.image_shape is not None:
            args += ["--image-shape", ",".join(map(str, self.image_shape))]
        return args

"""The inference paths a front end below Starlette's router answers itself, and their bodies' forms.

    POST /predict, /v1/models/{name}/predict                 JSON, raw bytes, one JPEG/PNG as the whole
                                                             body or a multipart upload: PredictCodec
    POST /v2/models/{name}[/versions/{version}]/infer        JSON tensors or the binary tensor
                                                             extension: V2Codec

The codecs are the Starlette routes' own (app/http/routes/predict.py, app/protocols/v2/rest.py), so
every door gives the same answer; tests/integration/test_inline_predict.py sends the same requests
through each.
"""

from __future__ import annotations

from app.http.heads import Head
from app.http.routes.predict import FORMAT_OF
from app.ops import metrics

# /predict's media types: every one it takes, read whole here (bodies up to INLINE_BODY_LIMIT).
PREDICT_FORMS = {media.encode(): form for media, form in FORMAT_OF.items()}


def form_of(route: str, media: bytes | None, header_length: bytes | None) -> str | None:
    """The body's form from its Content-Type and Inference-Header-Content-Length (the first of each, None
    where absent); None where the Starlette route answers it (a 415)."""
    if route == PREDICT:
        return PREDICT_FORMS.get(media or b"")
    return "json" if header_length is None else "binary"  # the v2 route reads no Content-Type


PREDICT, V2_INFER = "predict", "v2"  # which codec answers the path
V1_PREFIX, PREDICT_SUFFIX = "/v1/models/", "/predict"
V2_PREFIX, INFER_SUFFIX, VERSIONS = "/v2/models/", "/infer", "/versions/"


def route_of(path: str) -> tuple[str, str, str | None] | None:
    """(route, model as the path names it — "" for the default —, version or None) of an inline
    path, or None for any other (the ASGI router answers it)."""
    if path == PREDICT_SUFFIX:
        return PREDICT, "", None
    if path.startswith(V1_PREFIX) and path.endswith(PREDICT_SUFFIX):
        model = path[len(V1_PREFIX) : -len(PREDICT_SUFFIX)]
        return (PREDICT, model, None) if model and "/" not in model else None
    if path.startswith(V2_PREFIX) and path.endswith(INFER_SUFFIX):
        model, versions, version = path[len(V2_PREFIX) : -len(INFER_SUFFIX)].partition(VERSIONS)
        if not model or "/" in model or "/" in version or (versions and not version):
            return None
        return V2_INFER, model, version or None
    return None


def count_refused(path: str, head: Head, status: int) -> None:
    """An inference request refused before its route read it (app/http/limits.py's guard), in
    cgserve_requests_total as its route counts the answers it gives (no model: none was looked up), so that an error
    rate over that counter sees it; other paths' refusals are in cgserve_rejections_total alone."""
    found = route_of(path)
    if found is None or (form := form_of(found[0], head.media, head.header_length)) is None:
        return
    protocol = "rest" if found[0] == PREDICT else "v2"
    metrics.REQUESTS.labels(model="", protocol=protocol, format=form, code=str(status)).inc()

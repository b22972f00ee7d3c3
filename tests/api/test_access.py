"""Access control and request tracing through the ASGI lifespan (TestClient), on the CPU.

One app with everything on (inference tokens from a setting, admin tokens from a file, CORS,
the access log), one with everything off, as by default.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from starlette.routing import Route

from app import cli
from app.access.access_log import LOGGER, access_log
from app.access.request_id import RequestIdFilter
from app.access.tokens import TokenSet
from app.config import Settings, describe_errors
from app.main import create_app
from app.protocols.v2.unsupported import HTTP_ROUTES

INFERENCE = "inference-token-0123456789abcdef"
INFERENCE_2 = "second.inference~token/0123456789+"
ADMIN = "admin-token-from-a-file-0123456789"
ORIGIN = "https://ui.example"
MODEL = "fashion-cnn"
PIXELS = bytes(range(256)) * 3 + bytes(16)  # one 28×28 uint8 image: 784 bytes
RAW = {"content-type": "application/octet-stream"}
V2_BODY = orjson.dumps({"inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 1, 28, 28], "data": [7] * 784}]})

# (method, path, body, headers, kind): every route that takes a token, by kind.
PROTECTED = [
    ("POST", "/predict", PIXELS, RAW, "inference"),
    ("POST", f"/v1/models/{MODEL}/predict", PIXELS, RAW, "inference"),
    ("POST", f"/v2/models/{MODEL}/infer", V2_BODY, {"content-type": "application/json"}, "inference"),
    ("POST", f"/v2/models/{MODEL}/versions/1/infer", V2_BODY, {"content-type": "application/json"}, "inference"),
    ("GET", "/v2", b"", {}, "inference"),
    ("GET", f"/v2/models/{MODEL}", b"", {}, "inference"),
    ("GET", f"/v2/models/{MODEL}/ready", b"", {}, "inference"),
    ("GET", f"/v2/models/{MODEL}/config", b"", {}, "inference"),
    ("GET", f"/v2/models/{MODEL}/versions/1", b"", {}, "inference"),
    ("GET", f"/v2/models/{MODEL}/versions/1/ready", b"", {}, "inference"),
    ("GET", f"/v2/models/{MODEL}/versions/1/config", b"", {}, "inference"),
    ("GET", "/metrics", b"", {}, "admin"),
    ("GET", "/v1/models", b"", {}, "admin"),
    ("GET", f"/v1/models/{MODEL}", b"", {}, "admin"),
    ("GET", f"/v1/models/{MODEL}/ready", b"", {}, "admin"),
    ("POST", "/v2/repository/index", b"", {}, "admin"),  # the repository's: admin where admin tokens are set
]
# The model repository extension's load and unload: admin routes, answered 503 here (model control none).
CONTROL = [
    ("POST", f"/v2/repository/models/{MODEL}/{operation}", b"{}", {}, "admin") for operation in ("load", "unload")
]
OPEN = ["/healthz", "/readyz", "/v2/health/live", "/v2/health/ready", "/docs", "/redoc", "/openapi.json"]
# Triton's extensions this server refuses by name (app/protocols/v2/unsupported.py): under /v2, inference tokens.
UNSUPPORTED = [path.replace("{name}", MODEL).replace("{version}", "1").replace("{rest:path}", "status")
               for path in ("/v2" + path for path, _ in HTTP_ROUTES)]  # fmt: skip
TOKEN_OF = {"inference": INFERENCE, "admin": ADMIN}


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


class Lines(logging.Handler):
    """The records a logger receives, as formatted text."""

    def __init__(self, fmt: str = "%(message)s") -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(fmt))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture(scope="module")
def admin_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "admin-tokens"
    path.write_text(f"# admin tokens, one a line\n\n  {ADMIN}  \n")
    return path


@pytest.fixture(scope="module")
def root_log() -> Iterator[io.StringIO]:
    """A root handler in place before the app is created, as app/cli.py's basicConfig is."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))  # today's, without the time
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.DEBUG)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="module")
def secured(admin_file: Path, root_log: io.StringIO) -> Iterator[TestClient]:
    settings = Settings(
        auth_tokens=f"{INFERENCE}, {INFERENCE_2}",
        admin_tokens_file=admin_file,
        cors_origins=ORIGIN,
        access_log=True,
    )
    with TestClient(create_app(settings)) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        yield client


@pytest.fixture(scope="module")
def plain() -> Iterator[TestClient]:
    with TestClient(create_app(Settings())) as client:
        client.portal.call(client.app.state.service.wait_started)  # type: ignore[attr-defined]
        yield client


class AccessLines(list[str]):
    def written(self) -> list[str]:
        """The lines, once the access log's writer thread has handed over what is queued."""
        assert access_log().flush()
        return list(self)


@pytest.fixture
def access_lines() -> Iterator[AccessLines]:
    assert access_log().flush()  # earlier tests' lines go to the handlers of their time
    handler = Lines()
    handler.lines = lines = AccessLines()
    logging.getLogger(LOGGER).addHandler(handler)
    yield lines
    logging.getLogger(LOGGER).removeHandler(handler)


# --- tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "kind"), PROTECTED, ids=[f"{m} {p}" for m, p, *_ in PROTECTED]
)
def test_each_protected_route_refuses_no_token_a_wrong_one_and_the_other_kinds_and_takes_its_own(
    secured: TestClient, method: str, path: str, body: bytes, headers: dict[str, str], kind: str
) -> None:
    other = ADMIN if kind == "inference" else INFERENCE
    for token, invalid in ((None, False), ("wrong-token-0123456789abcdef", True), (other, True)):
        sent = headers | (bearer(token) if token else {})
        answer = secured.request(method, path, content=body, headers=sent)
        assert answer.status_code == 401, (token, answer.text)
        challenge = answer.headers["www-authenticate"]
        assert challenge.startswith("Bearer ") and ('error="invalid_token"' in challenge) == invalid
        error = answer.json()["error"]
        if path.startswith("/v2"):  # the protocol's own shape
            assert isinstance(error, str) and "bearer token" in error
        else:
            assert error["code"] == "unauthorized" and f"{kind} tokens" in error["expected"]
        assert INFERENCE not in answer.text and ADMIN not in answer.text
    answer = secured.request(method, path, content=body, headers=headers | bearer(TOKEN_OF[kind]))
    assert answer.status_code == 200, answer.text


def test_tritons_unsupported_extensions_take_the_inference_tokens_then_say_so(secured: TestClient) -> None:
    for path in UNSUPPORTED:
        assert secured.get(path).status_code == 401, path
        answer = secured.get(path, headers=bearer(INFERENCE))
        assert answer.status_code == 501 and "extension is not implemented" in answer.json()["error"], path


@pytest.mark.parametrize("path", [path for _, path, *_ in CONTROL])
def test_load_and_unload_take_the_admin_tokens_and_answer_as_triton_with_model_control_off(
    secured: TestClient, path: str
) -> None:
    for token in (None, INFERENCE):
        answer = secured.post(path, content=b"{}", headers=bearer(token) if token else {})
        assert answer.status_code == 401 and "admin tokens" in answer.json()["error"]
    answer = secured.post(path, content=b"{}", headers=bearer(ADMIN))
    assert answer.status_code == 503
    assert answer.json()["error"].startswith("explicit model load / unload is not allowed")  # Triton's words


@pytest.mark.parametrize("path", ["/v2/repository/index", *(path for _, path, *_ in CONTROL)])
def test_model_control_takes_the_inference_tokens_where_no_admin_token_is_set(path: str) -> None:
    """Never less guarded than an inference call: with only CGSERVE_AUTH_TOKENS set, a load or an unload is
    not open to anyone (before, the repository routes were admin ones, and admin without tokens is open)."""
    with TestClient(create_app(Settings(auth_tokens=INFERENCE))) as client:
        answer = client.post(path, content=b"{}")
        assert answer.status_code == 401 and "inference tokens" in answer.json()["error"]
        answer = client.post(path, content=b"{}", headers=bearer(INFERENCE))
        assert answer.status_code in (200, 503), answer.text  # index answers; load and unload: control is off


def test_every_configured_token_is_accepted_and_the_scheme_is_case_insensitive(secured: TestClient) -> None:
    for authorization in (
        f"Bearer {INFERENCE}",
        f"Bearer {INFERENCE_2}",
        f"bearer {INFERENCE}",
        f"BEARER  {INFERENCE}",
    ):
        answer = secured.post("/predict", content=PIXELS, headers=RAW | {"authorization": authorization})
        assert answer.status_code == 200, authorization
    for authorization in (
        INFERENCE,
        f"Basic {INFERENCE}",
        "Bearer",
        f"Bearer {INFERENCE}x",
        f"Bearer {INFERENCE[:-1]}",
    ):
        answer = secured.post("/predict", content=PIXELS, headers=RAW | {"authorization": authorization})
        assert answer.status_code == 401, authorization


def test_probes_and_docs_stay_open(secured: TestClient) -> None:
    for path in OPEN:
        assert secured.get(path).status_code == 200, path


def test_every_route_of_the_app_is_either_protected_or_meant_to_be_open(secured: TestClient) -> None:
    # A route added later lands in one list or the other here, or this fails.
    covered = {path for _, path, *_ in PROTECTED + CONTROL} | set(OPEN) | set(UNSUPPORTED)
    paths = route_paths(secured.app.routes)  # type: ignore[attr-defined]
    assert "/predict" in paths and "/v2/models/{name}/config" in paths
    for template in paths:
        path = template.replace("{name}", MODEL).replace("{version}", "1").replace("{rest:path}", "status")
        if path.startswith(("/docs/", "/static-offline-docs")):
            continue  # Swagger UI's redirect and the offline docs' files
        assert path in covered, f"{template} is in neither PROTECTED nor OPEN"


def route_paths(routes: list[Any]) -> list[str]:
    """Every route's path, inside the routers main.py includes (FastAPI keeps them as they were)."""
    paths = []
    for route in routes:
        if hasattr(route, "path"):
            paths.append(route.path)
        else:
            paths += route_paths(route.original_router.routes)
    return paths


# Issue 24.1: `$` passes a trailing newline and `.` stops at one, so a percent-encoded newline
# made a protected path look like none of the patterns and go through as "open".
NEWLINE_PATHS = [
    ("POST", "/v2/models/x%0Ay/infer", V2_BODY),
    ("POST", "/v2/models/x%0Dy/infer", V2_BODY),
    ("GET", "/v1/models/x%0Ay/ready", b""),
    ("GET", "/v1/models/x%0Ay", b""),
    ("GET", "/metrics%0A", b""),
    ("POST", "/v1/models/x%0A/predict", PIXELS),
    ("POST", "/predict%00", PIXELS),
    ("GET", "/v2/models/x%7Fy/ready", b""),
]


@pytest.mark.parametrize(("method", "path", "body"), NEWLINE_PATHS, ids=[f"{m} {p}" for m, p, _ in NEWLINE_PATHS])
def test_a_control_character_in_the_path_gets_400_before_any_handler(
    secured: TestClient, method: str, path: str, body: bytes
) -> None:
    for headers in ({}, bearer(INFERENCE), bearer(ADMIN)):
        answer = secured.request(method, path, content=body, headers=headers)
        assert answer.status_code == 400, (path, headers, answer.text)
        assert MODEL not in answer.text  # no handler ran: no 404 that lists the served models


def test_access_is_decided_on_the_whole_path() -> None:
    from app.access.auth import route_kind

    assert route_kind("/v2/models/x\ny/infer") == "inference"
    assert route_kind("/v1/models/x\ny/ready") == "admin"
    assert route_kind("/v2/health/live") == "open"
    # Starlette's own route patterns end in `$`, so "/metrics\n" reaches /metrics: such paths get
    # 400 before their kind is asked (test_a_control_character_in_the_path_gets_400_…).


def test_a_refused_request_counts_as_a_rejection_without_the_model_the_client_named(secured: TestClient) -> None:
    secured.post("/v1/models/made-up-name/predict", content=PIXELS, headers=RAW)
    metrics = secured.get("/metrics", headers=bearer(ADMIN)).text
    assert re.search(r'cgserve_rejections_total\{model="",reason="unauthorized"\} [1-9]', metrics)
    assert "made-up-name" not in metrics


def test_tokens_of_the_setting_and_its_file_together(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{INFERENCE_2}\n# {ADMIN}\n")
    settings = Settings(auth_tokens=INFERENCE, auth_tokens_file=path)
    tokens = TokenSet.load(settings.auth_tokens, settings.auth_tokens_file)
    assert len(tokens) == 2
    assert tokens.accepts(INFERENCE.encode()) and tokens.accepts(INFERENCE_2.encode())
    assert not tokens.accepts(ADMIN.encode()) and not tokens.accepts(b"")
    assert not TokenSet.load(None, None)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"auth_tokens": "shorttok"}, "CGSERVE_AUTH_TOKENS / --auth-tokens: Value error, token 1 is shorter than 16"),
        ({"admin_tokens": f"{ADMIN},with space 0123456789"}, "token 2 has characters a Bearer token cannot carry"),
        (
            {"auth_tokens_file": "/no/such/file"},
            "CGSERVE_AUTH_TOKENS_FILE / --auth-tokens-file: Value error, cannot read",
        ),
        ({"admin_tokens_file": "EMPTY"}, "holds no token"),
    ],
)
def test_bad_tokens_and_token_files_stop_the_start_up_with_one_line(
    tmp_path: Path, settings: dict[str, str], words: str
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n")
    settings = {k: str(empty) if v == "EMPTY" else v for k, v in settings.items()}
    with pytest.raises(ValidationError) as error:
        Settings(**settings)  # type: ignore[arg-type]
    described = describe_errors(error.value)  # what the CLI prints
    assert words in described
    for secret in ("shorttok", "with space", ADMIN):  # a token is never repeated
        assert secret not in described


def test_tokens_show_nowhere(
    secured: TestClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(auth_tokens=INFERENCE, admin_tokens=ADMIN)
    assert INFERENCE not in repr(settings) and INFERENCE not in str(settings.model_dump())
    described = secured.get("/v1/models", headers=bearer(ADMIN)).text + secured.get("/openapi.json").text
    assert INFERENCE not in described and ADMIN not in described
    monkeypatch.setenv("CGSERVE_AUTH_TOKENS", INFERENCE)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--help"])
    helped = capsys.readouterr().out
    assert "--auth-tokens" in helped and INFERENCE not in helped


# --- request ids -----------------------------------------------------------------------------


def test_a_sane_request_id_is_echoed_and_any_other_replaced_on_every_answer(secured: TestClient) -> None:
    answers = {
        "ok": secured.post("/predict", content=PIXELS, headers=RAW | bearer(INFERENCE) | {"x-request-id": "ok"}),
        "A-z_0.9-" * 16: secured.get("/healthz", headers={"x-request-id": "A-z_0.9-" * 16}),  # 128 characters
        "trace-401": secured.post("/predict", content=PIXELS, headers=RAW | {"x-request-id": "trace-401"}),
        "trace-404": secured.get("/nope", headers={"x-request-id": "trace-404"}),
        "trace-422": secured.post(
            "/predict", content=b"abc", headers=RAW | bearer(INFERENCE) | {"x-request-id": "trace-422"}
        ),
    }
    for sent, answer in answers.items():
        assert answer.headers["x-request-id"] == sent
    generated = [
        secured.get("/healthz").headers["x-request-id"],
        secured.get("/healthz", headers={"x-request-id": "x" * 129}).headers["x-request-id"],
        secured.get("/healthz", headers={"x-request-id": "a b"}).headers["x-request-id"],
        secured.get("/healthz", headers={"x-request-id": 'a\\"{}'}).headers["x-request-id"],
        secured.get("/healthz", headers={"x-request-id": ""}).headers["x-request-id"],
    ]
    assert all(re.fullmatch(r"[0-9a-f]{32}", made) for made in generated)
    assert len(set(generated)) == len(generated)


def test_an_unhandled_exception_still_gets_the_id_and_an_access_log_line(access_lines: AccessLines) -> None:
    app = create_app(Settings(request_ids=True, access_log=True))

    async def boom(request: object) -> None:
        raise RuntimeError("a bug")

    app.router.routes.append(Route("/boom", boom))
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.get("/boom", headers={"x-request-id": "trace-500"})
    assert answer.status_code == 500 and answer.headers["x-request-id"] == "trace-500"
    (line,) = (orjson.loads(line) for line in access_lines.written() if "trace-500" in line)
    assert line["status"] == 500 and line["path"] == "/boom"


def test_log_lines_written_while_handling_a_request_carry_its_id(
    secured: TestClient, root_log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.http.routes import predict

    async def failing_decode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("decoder bug")

    monkeypatch.setattr(predict, "decode_body", failing_decode)
    answer = secured.post("/predict", content=PIXELS, headers=RAW | bearer(INFERENCE) | {"x-request-id": "trace-log"})
    assert answer.status_code == 500 and answer.headers["x-request-id"] == "trace-log"
    secured.post("/predict", content=PIXELS, headers=RAW | {"x-request-id": "trace-refused"})
    lines = root_log.getvalue().splitlines()
    assert "ERROR app.dataplane: [trace-log] unexpected error in /predict" in lines
    assert "DEBUG app.access.auth: [trace-refused] refused POST /predict: no inference token" in lines
    assert not any("[trace-log]" in line for line in lines if "app.service" in line)  # not outside requests


def test_a_log_format_that_names_the_request_id_gets_it_as_a_field() -> None:
    from app.access.request_id import REQUEST_ID

    logger = logging.getLogger("tests.access.format")
    logger.propagate = False
    named, plain = Lines("%(request_id)s %(message)s"), Lines("%(message)s")
    named.addFilter(RequestIdFilter(into_message=False))
    plain.addFilter(RequestIdFilter(into_message=True))
    for handler in (named, plain):
        logger.addHandler(handler)
    logger.warning("outside %s", "any request")
    reset = REQUEST_ID.set("trace-field")
    logger.warning("inside %d%%", 100)
    REQUEST_ID.reset(reset)
    assert named.lines == ["- outside any request", "trace-field inside 100%"]
    assert plain.lines == ["outside any request", "[trace-field] inside 100%"]


# --- the access log --------------------------------------------------------------------------


def test_the_access_log_has_one_json_line_per_request_with_its_fields(
    secured: TestClient, access_lines: AccessLines
) -> None:
    predicted = secured.post("/predict", content=PIXELS, headers=RAW | bearer(INFERENCE) | {"x-request-id": "log-1"})
    named = secured.post(f"/v1/models/{MODEL}/predict", content=PIXELS * 2, headers=RAW | bearer(INFERENCE))
    refused = secured.get("/metrics")
    records = [orjson.loads(line) for line in access_lines.written()]
    assert len(records) == 3
    for record, answer in zip(records, (predicted, named, refused), strict=True):
        assert set(record) == {
            "time", "request_id", "protocol", "method", "path", "status", "duration_ms", "bytes_in", "bytes_out",
            "client", "model",
        }  # fmt: skip
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"])
        assert record["request_id"] == answer.headers["x-request-id"]
        assert record["status"] == answer.status_code
        assert record["bytes_out"] == len(answer.content)
        assert record["duration_ms"] > 0
        assert record["client"] == "testclient"
    assert records[0] | {"time": None, "duration_ms": None} == {
        "time": None, "request_id": "log-1", "protocol": "http", "method": "POST", "path": "/predict", "status": 200,
        "duration_ms": None, "bytes_in": 784, "bytes_out": len(predicted.content), "client": "testclient",
        "model": MODEL,
    }  # fmt: skip
    assert (records[1]["path"], records[1]["bytes_in"], records[1]["model"]) == (
        f"/v1/models/{MODEL}/predict",
        1568,
        MODEL,
    )
    assert (records[2]["method"], records[2]["status"], records[2]["model"]) == ("GET", 401, None)


# --- CORS ------------------------------------------------------------------------------------


def test_a_preflight_from_a_configured_origin_is_answered_before_any_token(secured: TestClient) -> None:
    preflight = {
        "origin": ORIGIN,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-request-id",
    }
    answer = secured.options("/predict", headers=preflight)
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert "authorization" in answer.headers["access-control-allow-headers"]
    refused = secured.options("/predict", headers=preflight | {"origin": "https://elsewhere.example"})
    assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    # The real request: its answer, a 401 too, may be read by the page, id and challenge included.
    for headers in ({}, bearer(INFERENCE)):
        answer = secured.post("/predict", content=PIXELS, headers=RAW | headers | {"origin": ORIGIN})
        assert answer.headers["access-control-allow-origin"] == ORIGIN
        exposed = answer.headers["access-control-expose-headers"]
        assert "x-request-id" in exposed and "www-authenticate" in exposed


# --- off by default --------------------------------------------------------------------------


def test_with_nothing_set_nothing_is_added(plain: TestClient, access_lines: AccessLines) -> None:
    assert "build_middleware_stack" not in vars(plain.app)  # the stack is FastAPI's own, unwrapped
    for method, path, body, headers, _ in PROTECTED:
        answer = plain.request(method, path, content=body, headers=headers | {"x-request-id": "ignored"})
        assert answer.status_code == 200, path
        assert "x-request-id" not in answer.headers
    preflight = {"origin": ORIGIN, "access-control-request-method": "POST"}
    answer = plain.options("/predict", headers=preflight)
    assert answer.status_code == 405 and "access-control-allow-origin" not in answer.headers
    assert access_lines.written() == []


def test_two_authorization_headers_get_400_whichever_is_right(secured: TestClient) -> None:
    for first, last in ((INFERENCE, "wrong-token-0123456789abcdef"), ("wrong-token-0123456789abcdef", INFERENCE)):
        headers = [("content-type", RAW["content-type"]), ("authorization", f"Bearer {first}"),
                   ("authorization", f"Bearer {last}")]  # fmt: skip
        answer = secured.post("/predict", content=PIXELS, headers=headers)
        assert answer.status_code == 400, answer.text
        assert "Authorization" in answer.text


def test_a_token_or_request_id_with_a_trailing_newline_is_not_taken() -> None:
    from app.access.request_id import choose
    from app.access.tokens import check_tokens

    assert choose(b"abc\n") != "abc\n" and choose(b"abc") == "abc"
    with pytest.raises(ValueError, match="characters"):
        check_tokens([INFERENCE + "\n"])

"""A client can name anything; only names of served models become metric labels (issue 23.2).

1,000 random model names over every ingress that takes one (our /predict routes, the Open
Inference Protocol over REST — inline and through ASGI — and over gRPC) must leave the number
of series in /metrics where it was, and the server's memory nearly so.
"""

from __future__ import annotations

import contextlib
import random
import string
from collections.abc import Callable, Iterator
from urllib.parse import quote

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from loadtest.server_process import free_port
from tests.integration.server_process import running_server, settled_metrics
from tests.reliability.common import SERVE

IMAGE = bytes(784)  # one 28×28 uint8 image
V2_BODY = orjson.dumps({"inputs": [{"name": "input", "datatype": "UINT8", "shape": [1, 1, 28, 28], "data": [0] * 784}]})
NAMES = 1000
RSS_GROWTH_LIMIT = 20 * 2**20  # loose: series cost kilobytes each, 1,000 names × 12 routes made ~18,000 of them


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    grpc_port = free_port()
    log = tmp_path_factory.mktemp("labels") / "server.log"
    with running_server(log, command=SERVE, device="cpu", grpc_port=str(grpc_port)) as url:
        yield {"url": url, "grpc": f"127.0.0.1:{grpc_port}"}


def chunks(body: bytes) -> Iterator[bytes]:
    """A body without Content-Length (chunked): never answered inline, so it takes the ASGI route."""
    yield body


@contextlib.contextmanager
def ingresses(server: dict[str, str]) -> Iterator[list[Callable[[str], object]]]:
    """One call a route, each taking a model name; its clients closed after (an open keep-alive connection holds
    the server's stop for its keep-alive timeout)."""
    http = httpx.Client(base_url=server["url"], timeout=30, trust_env=False)
    triton = triton_grpc.InferenceServerClient(server["grpc"])
    octets, json = {"content-type": "application/octet-stream"}, {"content-type": "application/json"}

    def grpc_infer(name: str) -> None:
        tensor = triton_grpc.InferInput("input", [1, 1, 28, 28], "UINT8")
        tensor.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.uint8))
        triton.infer(name, [tensor])

    def grpc_call(call: Callable[[str], object]) -> Callable[[str], object]:
        def refused(name: str) -> None:
            with pytest.raises(InferenceServerException, match="NOT_FOUND"):
                call(name)

        return refused

    def not_ready(ready: bool) -> None:
        assert ready is False

    with http, contextlib.closing(triton):
        yield [
            lambda n: http.post(f"/v1/models/{n}/predict", content=IMAGE, headers=octets),  # inline
            lambda n: http.post(f"/v1/models/{n}/predict", content=chunks(IMAGE), headers=octets),  # ASGI
            lambda n: http.post(f"/v2/models/{n}/infer", content=V2_BODY, headers=json),  # inline
            lambda n: http.post(f"/v2/models/{n}/versions/1/infer", content=chunks(V2_BODY), headers=json),  # ASGI
            lambda n: http.post(f"/v2/models/{n}/versions/{n}/infer", content=V2_BODY, headers=json),
            lambda n: http.get(f"/v2/models/{n}/ready"),
            lambda n: http.get(f"/v2/models/{n}"),
            lambda n: http.get(f"/v1/models/{n}/ready"),
            grpc_call(grpc_infer),
            lambda n: not_ready(triton.is_model_ready(n)),  # false, as Triton answers, not NOT_FOUND
            grpc_call(lambda n: triton.get_model_metadata(n)),
        ]


def series_and_rss(url: str) -> tuple[int, float]:
    families = list(text_string_to_metric_families(settled_metrics(url)))
    count = sum(len(family.samples) for family in families)
    rss = next(f.samples[0].value for f in families if f.name == "process_resident_memory_bytes")
    return count, rss


def random_name(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits + "-_.~é\"'{}", k=rng.randint(1, 40)))


def test_unknown_model_names_create_no_series(server: dict[str, str]) -> None:
    rng = random.Random(23_2)
    with ingresses(server) as send:
        for index in range(2 * len(send)):  # every refusal's own series once (under no client's name)
            send[index % len(send)](quote(random_name(rng), safe=""))
        before, rss_before = series_and_rss(server["url"])
        for index in range(NAMES):
            name = random_name(rng)
            status = send[index % len(send)](quote(name, safe=""))
            if isinstance(status, httpx.Response):
                assert status.status_code in (400, 404, 422), (name, status.status_code, status.text)
    after, rss_after = series_and_rss(server["url"])
    assert after == before, f"{after - before} series appeared for {NAMES} unknown model names"
    assert rss_after - rss_before < RSS_GROWTH_LIMIT, (rss_before, rss_after)
    # The served model's own series still carry its name.
    assert 'model="fashion-cnn"' in httpx.get(f"{server['url']}/metrics").text

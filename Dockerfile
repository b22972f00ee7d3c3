# cudagraph-serve, in two images from one file:
#   docker build --target gpu -t cudagraph-serve:gpu .   NVIDIA GPU: CUDA graphs of inductor's kernels
#   docker build --target cpu -t cudagraph-serve:cpu .   no GPU: eager on the CPU, a fifth of the size
# A plain `docker build .` builds the last stage, gpu. Both run as uid 10001, answer HEALTHCHECK
# on /readyz and start with `cudagraph-serve serve --host 0.0.0.0`, the command README's `make
# serve` runs.

# --- door ------------------------------------------------------------------------------------
# app/front_door/door.c, grpc.c and launch.c as a shared library, for CGSERVE_FRONT_DOOR_PORT (off by
# default): built here, where a compiler and nghttp2's headers are, so that neither image builds it
# at start-up. Bookworm's glibc is older than either image's, so the one file loads in both; each
# image installs nghttp2's library (libnghttp2-14), which grpc.c's HTTP/2 links against.
FROM debian:bookworm-slim AS door
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libnghttp2-dev \
    && rm -rf /var/lib/apt/lists/*
COPY app/front_door/door.h app/front_door/door.c app/front_door/grpc.c app/front_door/launch.c /tmp/door/
RUN gcc -O2 -shared -fPIC -pthread -o /libfrontdoor.so /tmp/door/door.c /tmp/door/grpc.c /tmp/door/launch.c -lnghttp2 -ldl -lm

# --- cpu ------------------------------------------------------------------------------------
# A slim Debian Python and torch's CPU wheel from PyTorch's own index: PyPI's Linux torch is the
# CUDA build, several GB of libraries this image would never load. No C compiler (nothing is
# compiled: the CPU engine runs the module eagerly, the front door comes built) and no compile cache.
FROM python:3.12-slim-bookworm AS cpu

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/cgserve

# nghttp2's library, for the front door's gRPC (the door stage's build links it).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnghttp2-14 \
    && rm -rf /var/lib/apt/lists/*

# The torch release `make serve` installs (Makefile's TORCH), CPU build; the last line fails the
# build if a CUDA build slipped in.
RUN python3 -m pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && python3 -c "import torch; assert torch.version.cuda is None, 'expected the CPU build of torch'"

# Dependencies read from pyproject.toml alone, so that editing app/ or models/ reuses this layer;
# torch>=2.4 is already met, so pip keeps the CPU build. The tracing extra too (pure Python, a few MB):
# CGSERVE_TRACING=otlp is a setting, and an image without its SDK could not start with it.
COPY pyproject.toml ./
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['tracing']))" \
        > /tmp/requirements.txt \
    && python3 -m pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && python3 -c "import torch; assert torch.version.cuda is None, 'a dependency replaced the CPU build of torch'"

COPY README.md ./
COPY app/ app/
COPY models/ models/
COPY loadtest/ loadtest/
# A numeric, non-root user: Kubernetes' runAsNonRoot can check a number, not a name.
RUN python3 -m pip install --no-cache-dir --no-deps . \
    && groupadd --system --gid 10001 cgserve \
    && useradd --system --no-log-init --uid 10001 --gid 10001 --create-home \
        --home-dir /home/cgserve --shell /usr/sbin/nologin cgserve
COPY --from=door /libfrontdoor.so /opt/cgserve/libfrontdoor.so
ENV CGSERVE_FRONT_DOOR_LIBRARY=/opt/cgserve/libfrontdoor.so
USER 10001:10001

# HTTP (our API and the Open Inference Protocol's REST form), gRPC (CGSERVE_GRPC_PORT) and the
# front door and its gRPC where they are on (CGSERVE_FRONT_DOOR_PORT, CGSERVE_FRONT_DOOR_GRPC_PORT).
EXPOSE 8000 8001 8002 8003

# Ready = every model's engine built (GET /readyz answers 200). urlopen raises on 503 or no
# answer, and python3 then exits 1 (unhealthy). The image has python3 but no curl.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python3", "-m", "app.runtime.healthcheck"]

CMD ["cudagraph-serve", "serve", "--host", "0.0.0.0"]

# --- gpu ------------------------------------------------------------------------------------
# Base: the official PyTorch runtime image rather than nvidia/cuda + a torch wheel. The wheel
# bundles its own CUDA and cuDNN libraries, so on nvidia/cuda they would be there twice (~3 GB);
# here torch, CUDA 12.8 and cuDNN 9 come as one tested set. torch 2.11 is the release the
# project's GPU runs use; CUDA 12.8 has kernels for Hopper (H100/H200) and Blackwell and needs
# only a >= 570 driver (a CUDA 13 build needs >= 580). `runtime`, not `devel`: nothing is
# compiled here. Its Python is Ubuntu 24.04's python3 (3.12).
FROM pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime AS gpu

# The base image's python3 is marked externally managed (PEP 668); this container has no other
# user of it, so pip installs next to torch, as the base image itself did.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/cgserve

# A C compiler and Python's headers for Triton: the graph engine compiles the model with inductor
# by default (CGSERVE_COMPILE=inductor) and Triton builds its small launcher stub, which includes
# Python.h, with gcc the first time it runs (and nghttp2's library, for the front door's gRPC).
# Versions follow the base image's Ubuntu release.
# The second RUN compiles against Python.h at build time: an image without the toolchain fails to
# build, rather than start every model on the eager module's graphs (CGSERVE_COMPILE_STRICT).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev python3-dev libnghttp2-14 \
    && rm -rf /var/lib/apt/lists/*
RUN printf '#include <Python.h>\nint main(void) { return Py_IsInitialized(); }\n' > /tmp/toolchain.c \
    && gcc -fsyntax-only -I"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" /tmp/toolchain.c \
    && rm /tmp/toolchain.c

# Dependencies first, read from pyproject.toml alone (and the tracing extra, as in cpu), so that
# editing app/ or models/ reuses this layer. torch>=2.4 is already met by the base image, so pip
# keeps its CUDA build; the last line fails the build if anything replaced it.
COPY pyproject.toml ./
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['tracing']))" \
        > /tmp/requirements.txt \
    && python3 -m pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && python3 -c "import torch; assert torch.version.cuda, 'torch lost its CUDA build'"

# The code and the shipped weights (models/*.pt is package data).
COPY README.md ./
COPY app/ app/
COPY models/ models/
COPY loadtest/ loadtest/
RUN python3 -m pip install --no-cache-dir --no-deps . \
    && groupadd --system --gid 10001 cgserve \
    && useradd --system --no-log-init --uid 10001 --gid 10001 --create-home \
        --home-dir /home/cgserve --shell /usr/sbin/nologin cgserve \
    && mkdir -p /var/cache/cgserve && chown 10001:10001 /var/cache/cgserve
# Inductor's compiled kernels, and Triton's beside them (not under $HOME, which a read-only root
# file system would refuse): a volume here (compose, Kubernetes) makes a restart skip compiling.
ENV CGSERVE_COMPILE_CACHE_DIR=/var/cache/cgserve/inductor \
    TRITON_CACHE_DIR=/var/cache/cgserve/triton
COPY --from=door /libfrontdoor.so /opt/cgserve/libfrontdoor.so
ENV CGSERVE_FRONT_DOOR_LIBRARY=/opt/cgserve/libfrontdoor.so
USER 10001:10001

EXPOSE 8000 8001 8002 8003

# The start period covers CUDA start-up, inductor's compile and graph capture (60 s for
# ResNet-50 with a cold cache on the H200, bench/results/README.md).
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python3", "-m", "app.runtime.healthcheck"]

# The port comes from CGSERVE_PORT (default 8000), the rest of the configuration from CGSERVE_*
# variables.
CMD ["cudagraph-serve", "serve", "--host", "0.0.0.0"]

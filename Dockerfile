# ortserve images, one per role. No model is baked in: compose.yaml's `model`
# service (or compose.seed.yaml, from this machine's model cache) fills a volume.
#
#   docker build --target scheduler -t ortserve:scheduler .  scheduler, gateway, probe, CLI: no ONNX Runtime
#   docker build --target cpu       -t ortserve:cpu .        the worker on CPU (onnxruntime)
#   docker build --target cuda      -t ortserve:cuda .       the worker on CUDA (onnxruntime-gpu)
#   docker build --target tools     -t ortserve:tools .      model preparation (torch)
#
# BASE: any Debian-based image with Python >= 3.11, its venv module and useradd,
# e.g. a mirror of python:3.11-slim-bookworm or a debootstrapped Debian 12
# (`make compose-test` makes one: devtools/compose_test.sh). Pass
# ORTSERVE_VERSION (pyproject's, checked by tests/unit/repo/test_dockerfile.py) and
# ORTSERVE_REVISION (the commit) for the labels.

ARG BASE=python:3.11-slim-bookworm
# onnxruntime-gpu 1.31.1 is a CUDA 13 build: its CUDA provider links against
# libcublasLt.so.13, libcublas.so.13, libcudart.so.13 and libcurand.so.10, which the
# `runtime` flavour ships; it needs no cuDNN. tests/unit/repo/test_cuda_image.py compares
# this tag with the installed provider's NEEDED entries (python -m devtools.cuda_image).
ARG CUDA_BASE=nvidia/cuda:13.0.2-runtime-ubuntu24.04
ARG ORTSERVE_VERSION=0.1.0
ARG ORTSERVE_REVISION=unknown

# --- what every Python image shares: a venv, a non-root user, the labels -----
FROM ${BASE} AS python-base
# The version and revision labels come last in each target: a new commit must
# not invalidate the cached dependency layers.
LABEL org.opencontainers.image.title="ortserve" \
      org.opencontainers.image.description="LLM serving over gRPC on ONNX Runtime" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
# A venv rather than the base's site-packages: the same layout on every base
# (python:3.11-slim, Debian's python3, Ubuntu's externally managed one).
# /models is created owned by the service user so a fresh named volume is writable;
# a home of its own, for what libraries cache under ~ (ORT's telemetry id, transformers).
RUN python3 -m venv /opt/venv \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /home/ortserve \
      --shell /usr/sbin/nologin ortserve \
 && mkdir -p /app /models && chown ortserve:ortserve /models
WORKDIR /app
COPY pyproject.toml devtools/image_requirements.py /build/

# --- the ortserve wheel (no dependencies), built once for every image --------
FROM python-base AS wheel
COPY README.md /build/
COPY protos /build/protos
COPY ortserve /build/ortserve
COPY scheduler_service /build/scheduler_service
COPY worker_service /build/worker_service
COPY gateway /build/gateway
COPY clients/python /build/clients/python
RUN pip wheel --no-deps --wheel-dir /wheels /build

# --- scheduler, gateway, probe and the CLI -----------------------------------
FROM python-base AS scheduler
# Dependencies before the code: a layer that changes rarely.
RUN python3 /build/image_requirements.py --role scheduler --pyproject /build/pyproject.toml \
      > /build/requirements.txt \
 && pip install -r /build/requirements.txt
COPY --from=wheel /wheels /wheels
# ortserve-worker needs ONNX Runtime, which this image leaves out: no dead entry point.
RUN pip install --no-deps /wheels/*.whl && rm -rf /wheels /opt/venv/bin/ortserve-worker
USER ortserve
EXPOSE 50051 50061
# The same check as compose.yaml's scheduler (tests/unit/repo/test_dockerfile.py compares them).
HEALTHCHECK --interval=5s --timeout=3s --retries=10 CMD ["ortserve-probe", "127.0.0.1:50051"]
ARG ORTSERVE_VERSION
ARG ORTSERVE_REVISION
LABEL org.opencontainers.image.version="${ORTSERVE_VERSION}" \
      org.opencontainers.image.revision="${ORTSERVE_REVISION}"
CMD ["ortserve-scheduler"]

# --- the worker on CPU --------------------------------------------------------
FROM python-base AS cpu
RUN python3 /build/image_requirements.py --role worker-cpu --pyproject /build/pyproject.toml \
      > /build/requirements.txt \
 && pip install -r /build/requirements.txt
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /wheels
ENV ORTSERVE_WORKER_DEVICE=cpu
USER ortserve
EXPOSE 50052
HEALTHCHECK --interval=5s --timeout=3s --retries=30 CMD ["ortserve-probe", "127.0.0.1:50052", "--service", "ortserve.v1.Worker"]
ARG ORTSERVE_VERSION
ARG ORTSERVE_REVISION
LABEL org.opencontainers.image.version="${ORTSERVE_VERSION}" \
      org.opencontainers.image.revision="${ORTSERVE_REVISION}"
CMD ["ortserve-worker"]

# --- the worker on CUDA (needs the NVIDIA container toolkit to run) ------------
# Its tail repeats the cpu target's: stages on different bases cannot share
# instructions (only files, through COPY --from), and the bases differ here.
FROM ${CUDA_BASE} AS cuda
LABEL org.opencontainers.image.title="ortserve" \
      org.opencontainers.image.description="LLM serving over gRPC on ONNX Runtime (CUDA worker)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && useradd --system --uid 10001 --user-group --create-home --home-dir /home/ortserve \
      --shell /usr/sbin/nologin ortserve \
 && mkdir -p /app /models && chown ortserve:ortserve /models
WORKDIR /app
COPY pyproject.toml devtools/image_requirements.py /build/
RUN python3 /build/image_requirements.py --role worker-cuda --pyproject /build/pyproject.toml \
      > /build/requirements.txt \
 && pip install -r /build/requirements.txt
COPY --from=wheel /wheels /wheels
RUN pip install --no-deps /wheels/*.whl && rm -rf /wheels
ENV ORTSERVE_WORKER_DEVICE=cuda
USER ortserve
EXPOSE 50052
HEALTHCHECK --interval=5s --timeout=3s --retries=30 CMD ["ortserve-probe", "127.0.0.1:50052", "--service", "ortserve.v1.Worker"]
ARG ORTSERVE_VERSION
ARG ORTSERVE_REVISION
LABEL org.opencontainers.image.version="${ORTSERVE_VERSION}" \
      org.opencontainers.image.revision="${ORTSERVE_REVISION}"
CMD ["ortserve-worker"]

# --- model preparation (torch; large) -------------------------------------------
FROM python-base AS tools
# Point PIP_EXTRA_INDEX_URL at a CPU-only torch index to keep this image small.
ARG PIP_EXTRA_INDEX_URL=""
ENV HF_HUB_OFFLINE=1
COPY model_tools /app/model_tools
RUN pip install -r model_tools/requirements.txt \
 && pip install --no-deps -r model_tools/requirements-nodeps.txt
USER ortserve
ARG ORTSERVE_VERSION
ARG ORTSERVE_REVISION
LABEL org.opencontainers.image.version="${ORTSERVE_VERSION}" \
      org.opencontainers.image.revision="${ORTSERVE_REVISION}"
CMD ["python3", "-m", "model_tools.prepare"]

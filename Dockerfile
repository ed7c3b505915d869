# The rlvr image for GPU hosts (docker-compose.yml). CUDA wheels come with torch/vllm from PyPI (torch
# 2.13.0's are CUDA 13 builds: the host needs an NVIDIA driver of the R580 series or later).
# Build: docker build -t rlvr:latest .   (or: docker compose build); docs/gpu.md.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos protos
COPY rlvr rlvr
COPY services services
COPY clients clients
RUN pip install --no-cache-dir '.[gpu,s3]'
# vLLM 0.32.0 pins torchaudio 2.11.0 and torchvision 0.28.0 beside torch 2.13.0; rlvr uses neither, and
# make install removes them on CPU hosts for breaking `import transformers` (docs/gpu.md).
RUN pip uninstall -y torchvision torchaudio torchcodec || true
ENV PYTHONUNBUFFERED=1

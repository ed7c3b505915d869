# The rlvr image for GPU hosts (docker-compose.yml). CUDA wheels come with torch/vllm from PyPI.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos protos
COPY rlvr rlvr
COPY services services
COPY clients clients
RUN pip install --no-cache-dir '.[gpu]'
ENV PYTHONUNBUFFERED=1

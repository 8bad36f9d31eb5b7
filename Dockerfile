# The AgentFly image: the library, the trainer and the web app. One image serves as web server and worker.
#   docker build -t agentfly .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    DJANGO_SETTINGS_MODULE=webapp.settings STATIC_ROOT=/app/staticfiles
WORKDIR /app

RUN apt-get update && apt-get install -y --no-install-recommends build-essential libpq5 \
    && rm -rf /var/lib/apt/lists/*

# Dependencies first, so code edits do not reinstall them. The CPU wheel of torch keeps the image small;
# GPU hosts build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 instead.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
RUN pip install --index-url ${TORCH_INDEX} torch==2.13.0 && mkdir -p agentfly trainer webapp \
    && touch agentfly/__init__.py trainer/__init__.py webapp/__init__.py && pip install ".[trackers]" && pip uninstall -y agentfly

COPY . .
RUN pip install --no-deps . \
    && useradd --create-home --uid 1000 agentfly && mkdir -p /data/runs /data/plugins /data/models /data/datasets \
    && chown -R agentfly /data /app
USER agentfly

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "webapp.asgi:application"]

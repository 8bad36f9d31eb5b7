# The AgentFly image: the library, the trainer and the web app. One image serves as web server and worker.
#
#   docker build -t agentfly .                                               # CPU torch (the default)
#   docker build -t agentfly:cuda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#                --build-arg EXTRAS=docker,gpu .                             # CUDA torch + NVML, for GPU hosts
#
# Build arguments:
#   BASE_IMAGE   the Debian bookworm image both stages start from (default debian:bookworm-slim; the stack
#                test uses one made locally with debootstrap, see docs/deployment.md)
#   TORCH_INDEX  where torch==2.13.0 comes from: PyTorch's CPU index by default, a CUDA index for GPU hosts,
#                or empty to take it from PyPI / deploy/local/wheels only
#   EXTRAS       the pyproject extras installed besides the base dependencies (default "docker,ray,trackers")
# Files in deploy/local/wheels/ (wheels pip may use) and deploy/local/ca-certificates/ (*.crt trusted while
# building, for a network that inspects TLS) are seen by the build stage only; both are empty in git.
ARG BASE_IMAGE=debian:bookworm-slim

# ------------------------------------------------------------------ build: compilers and pip live only here
FROM ${BASE_IMAGE} AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/local/ca-certificates/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
COPY deploy/local/wheels/ /wheels/
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# torch first and alone: an unpinned torch, pulled in by a dependency, would be a multi-GB CUDA build.
RUN pip install --find-links /wheels ${TORCH_INDEX:+--index-url ${TORCH_INDEX}} torch==2.13.0

# The dependencies from pyproject.toml, without the project (it runs from /app, see PYTHONPATH below). They
# are listed in a stage of their own, so that a pyproject edit that changes no dependency (a test marker, a
# lint rule) leaves the requirements file, and so the install layer below, as it was.
FROM build AS requirements
ARG EXTRAS=docker,ray,trackers
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c "import tomllib, sys; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
extras = [e for e in sys.argv[1].split(',') if e]; \
print('\n'.join(p['dependencies'] + [d for e in extras for d in p['optional-dependencies'][e]]))" "${EXTRAS}" \
        > /tmp/requirements.txt

FROM build AS dependencies
COPY --from=requirements /tmp/requirements.txt /tmp/requirements.txt
RUN pip install --find-links /wheels -r /tmp/requirements.txt
# pip and setuptools are build tools: the runtime installs nothing.
RUN pip uninstall -y -q pip setuptools wheel || true

# ------------------------------------------------------------------ runtime: Python, the venv, the code
FROM ${BASE_IMAGE} AS runtime
# bubblewrap: each job runs as its team, and each sandbox in a root of its own (docs/security.md).
RUN apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates bubblewrap \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --user-group agentfly \
    && mkdir -p /data/runs /data/plugins /data/models /data/datasets && chown -R agentfly:agentfly /data
COPY --from=dependencies /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/app PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=webapp.settings STATIC_ROOT=/app/staticfiles AGENTFLY_RUNS_DIR=/data/runs
WORKDIR /app
COPY agentfly agentfly
COPY trainer trainer
COPY webapp webapp
COPY templates templates
COPY static static
COPY plugins plugins
COPY manage.py pyproject.toml ./
COPY deploy/healthcheck.py /usr/local/bin/agentfly-healthcheck
# Static files are collected (hashed and compressed by whitenoise) at build time, so pages work with DEBUG=0
# from the first start. The key is a throwaway: collectstatic signs nothing.
RUN SECRET_KEY=collectstatic-only DEBUG=0 python manage.py collectstatic --noinput -v 0 \
    && python -m compileall -q agentfly trainer webapp
USER agentfly
EXPOSE 8000
# The web server's check; the workers' services set their own (`agentfly-healthcheck worker`).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=5 CMD ["python", "/usr/local/bin/agentfly-healthcheck", "web"]
CMD ["python", "-m", "webapp.serve", "-b", "0.0.0.0", "-p", "8000", "webapp.asgi:application"]

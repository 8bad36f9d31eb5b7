# The docker sandbox backend's image (AGENTFLY_SANDBOX_IMAGE): Debian's Python and nothing else. The sandbox
# runs `python -I -c <worker>` as nobody with no network; a stock python:3.11-slim works as well.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends python3-minimal python3 \
    && rm -rf /var/lib/apt/lists/* && ln -s /usr/bin/python3 /usr/local/bin/python

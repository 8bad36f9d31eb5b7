# The docker workspace's image (AGENTFLY_WORKSPACE_IMAGE, default agentfly-workspace:local): what a coding agent's
# commands need, from Debian's packages: bash and coreutils, git, Python with pytest. The workspace runs its
# container as nobody with no network, and makes /workspace nobody's itself, so any image with bash, git,
# python3 and pytest serves as well (e.g. python:3.11 with git installed).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends git python3 python3-pytest procps \
    && rm -rf /var/lib/apt/lists/* && ln -s /usr/bin/python3 /usr/local/bin/python

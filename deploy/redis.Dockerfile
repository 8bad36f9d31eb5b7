# Redis from Debian's package, for machines that cannot pull redis:7-alpine (the stack test builds it on the
# same local base as the app image):  docker build -f deploy/redis.Dockerfile --build-arg BASE_IMAGE=... deploy
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]

# PostgreSQL from Debian's package, for machines that cannot pull postgres:16-alpine. It honours the official
# image's POSTGRES_DB / POSTGRES_USER / POSTGRES_PASSWORD and keeps its data in /var/lib/postgresql/data.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint"]

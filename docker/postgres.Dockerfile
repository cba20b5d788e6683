# PostgreSQL 15 for the team server (compose.team.yaml) where no image registry is
# reachable: Debian's postgresql-15 package on the base that scripts/docker-base.sh makes,
# started the way the official postgres:15 image starts (the same POSTGRES_USER,
# POSTGRES_DB, POSTGRES_PASSWORD / POSTGRES_PASSWORD_FILE and PGDATA), so compose.team.yaml
# runs either. scripts/docker-postgres.sh builds it and prints its name:
#   GRADWATCH_POSTGRES_IMAGE=$(scripts/docker-postgres.sh)
ARG BASE=debian:bookworm-slim
FROM ${BASE}
# The postgres user made first with the official image's fixed ids (999), so a volume moves
# between the two images. No cluster from the package's own scripts: the entrypoint makes
# one in PGDATA, the volume. Unpinned: Debian's mirror keeps only the current security
# release of postgresql-15, so a pinned version would stop building.
# hadolint ignore=DL3008
RUN groupadd --system --gid 999 postgres \
    && useradd --system --gid postgres --uid 999 --home-dir /var/lib/postgresql \
        --shell /bin/sh postgres \
    && mkdir -p /etc/postgresql-common \
    && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf \
    && apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        postgresql-15 \
    && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown postgres:postgres /var/lib/postgresql/data /var/run/postgresql \
    && chmod 700 /var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
# The postgres user owns the data directory (made above, so a fresh named volume starts out
# owned by it); the server never runs as root.
USER 999:999
VOLUME ["/var/lib/postgresql/data"]
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/bin/sh", "/usr/local/bin/postgres-entrypoint"]

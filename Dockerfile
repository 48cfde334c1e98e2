# syntax=docker/dockerfile:1
# outbox-relay image: a Debian bookworm build stage running the same dependency and build scripts
# as CI, and a slim runtime stage with only the shared libraries the binary links.
#   docker build -t outbox-relay:local .
#   docker run --rm -e DATABASE_URL=... -v $PWD/relay.yaml:/etc/outbox-relay/config.yaml:ro outbox-relay:local

FROM debian:bookworm AS build
WORKDIR /src
# The dependency layer is cached until the script changes.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --runtime-build && rm -rf /var/lib/apt/lists/*
COPY . .
# scripts/build.sh is CI's build (cmake + Ninja, warnings as errors); only the binary is needed.
# A compiler cache survives between builds (BuildKit / buildah cache mount), so a changed source
# recompiles only what changed. BUILD_JOBS: parallel compile jobs (default: all cores).
ARG BUILD_JOBS
RUN --mount=type=cache,id=outbox-relay-ccache,target=/root/.cache/ccache,sharing=locked \
    CCACHE_DIR=/root/.cache/ccache BUILD_DIR=/src/build BUILD_TARGETS=outbox-relay BUILD_JOBS="${BUILD_JOBS:-$(nproc)}" \
      scripts/build.sh -DOUTBOX_WERROR=ON -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
 && CCACHE_DIR=/root/.cache/ccache ccache --show-stats | grep -Ei 'hits|misses' \
 && strip --strip-debug -o /outbox-relay build/bin/outbox-relay \
 && /outbox-relay --version
# The Debian packages that own the binary's shared libraries: the runtime stage installs exactly
# these. (With merged /usr, a library may be registered under /lib or /usr/lib: try both.)
RUN set -eu; \
    for lib in $(ldd /outbox-relay | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'); do \
      dpkg -S "$lib" 2> /dev/null || dpkg -S "/usr$lib" 2> /dev/null || dpkg -S "${lib#/usr}"; \
    done | cut -d: -f1 | sort -u > /runtime-packages \
 && cat /runtime-packages

FROM debian:bookworm-slim AS runtime
COPY --from=build /runtime-packages /tmp/runtime-packages
# curl: the HEALTHCHECK client (libcurl is a runtime dependency anyway).
RUN apt-get update \
 && xargs -a /tmp/runtime-packages apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages \
 && groupadd --system --gid 10001 outbox-relay \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/outbox-relay --create-home \
      --shell /usr/sbin/nologin outbox-relay
COPY --from=build /outbox-relay /usr/local/bin/outbox-relay
USER 10001:10001
WORKDIR /var/lib/outbox-relay
# /metrics, /healthz, /readyz. The config must set http.listen: 0.0.0.0:9187 to reach it from
# outside the container (the default, 127.0.0.1:9187, serves the HEALTHCHECK only).
EXPOSE 9187
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:9187/healthz || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/outbox-relay"]
CMD ["run", "--config", "/etc/outbox-relay/config.yaml"]

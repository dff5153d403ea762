# syntax=docker/dockerfile:1.7
# Builds the three binaries once, then one small non-root image per binary:
#   docker build --target operator  -t orchestrator-operator:dev .
#   docker build --target mcp-proxy -t orchestrator-mcp-proxy:dev .
#   docker build --target cli       -t orchestrator-cli:dev .
# (No container engine runs on our development machines; CI builds and tests the binaries
# directly. These targets are for users and release automation.)

ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
      -p orchestrator-operator -p orchestrator-mcp-proxy -p orchestrator-cli \
 && mkdir -p /out \
 && cp target/release/orchestrator-operator target/release/orchestrator-mcp-proxy \
       target/release/orchestrator-cli /out/

# The operator and the CLI need only libc: distroless, non-root.
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
COPY --from=build /out/orchestrator-operator /usr/local/bin/orchestrator-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/orchestrator-operator"]

FROM gcr.io/distroless/cc-debian12:nonroot AS cli
COPY --from=build /out/orchestrator-cli /usr/local/bin/orchestrator-cli
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/orchestrator-cli"]

# The proxy starts catalog servers as children (npx for the npm ones, uvx for the PyPI ones), so
# its image carries Node.js and Python with uv. It runs with a read-only root filesystem: npm and
# uv caches go to HOME, which the pod mounts as an emptyDir.
FROM node:22-bookworm-slim AS mcp-proxy
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates git tini \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir uv \
 && ln -s /opt/uv/bin/uv /opt/uv/bin/uvx /usr/local/bin/
COPY --from=build /out/orchestrator-mcp-proxy /usr/local/bin/orchestrator-mcp-proxy
ENV HOME=/home/proxy
USER 65532:65532
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/orchestrator-mcp-proxy"]

# Default: the operator.
FROM operator

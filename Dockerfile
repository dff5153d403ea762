# syntax=docker/dockerfile:1.7
# Builds the three binaries once, then one small non-root image per binary:
#   docker build --target operator  -t orchestrator-operator:dev .
#   docker build --target mcp-proxy -t orchestrator-mcp-proxy:dev .
#   docker build --target cli       -t orchestrator-cli:dev .
#   docker build --target agent     -t orchestrator-agent:dev .   (Claude Code)
#   docker build --target agent-codex    -t orchestrator-agent-codex:dev .     (Codex CLI)
#   docker build --target agent-gemini   -t orchestrator-agent-gemini:dev .    (Gemini CLI)
#   docker build --target agent-opencode -t orchestrator-agent-opencode:dev .  (OpenCode, linux/amd64)
# Each for linux/amd64 or linux/arm64 (`docker buildx build --platform linux/arm64 ...`: every
# stage runs on that platform, npm takes its platform packages), but agent-opencode, amd64 only
# (docs/release.md). (No container engine runs on our development machines: releases are built by
# scripts/release from e2e/images/build, which these targets mirror; they are for users.)

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
       target/release/orchestrator-cli target/release/orchestrator-agent /out/

# The operator and the CLI need only libc: distroless, non-root.
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
COPY --from=build /out/orchestrator-operator /usr/local/bin/orchestrator-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/orchestrator-operator"]

FROM gcr.io/distroless/cc-debian12:nonroot AS cli
COPY --from=build /out/orchestrator-cli /usr/local/bin/orchestrator-cli
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/orchestrator-cli"]

# The proxy's image also runs each of the task's stdio MCP servers, in that server's own
# container of the pod (`orchestrator-mcp-proxy zone`), so it carries them: the catalog's npm servers (e2e/images/mcp-servers/package.json, with npm/npx for servers of your
# own) and PyPI servers (requirements.txt, with uv/uvx) preinstalled at their pinned versions, so
# a pod never downloads a server at start (config/catalog.yaml runs these bins). The same layout
# as e2e/images/build, which the tests run on a real node: Debian 12, Node.js 22, Python 3 with
# a venv in /opt/mcp-servers/venv, user 65532, HOME=/tmp (an emptyDir in the pod; the root
# filesystem is read-only), working directory /workspace.
FROM node:22-bookworm-slim AS mcp-proxy
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates git \
 && rm -rf /var/lib/apt/lists/*
COPY e2e/images/mcp-servers/ /opt/mcp-servers/
RUN cd /opt/mcp-servers \
 && npm ci --omit=dev --no-audit --no-fund \
 && python3 -m venv /opt/mcp-servers/venv \
 && /opt/mcp-servers/venv/bin/pip install --no-cache-dir -r requirements.txt \
 && for b in npm npx mcp-server-everything mcp-server-filesystem mcp-server-memory mcp-server-github; do \
      ln -sf /opt/mcp-servers/node_modules/.bin/$b /usr/local/bin/$b; done \
 && for b in mcp-server-time mcp-server-git uv uvx; do \
      ln -sf /opt/mcp-servers/venv/bin/$b /usr/local/bin/$b; done \
 && mkdir -p /workspace && chown 65532:65532 /workspace
COPY --from=build /out/orchestrator-mcp-proxy /usr/local/bin/orchestrator-mcp-proxy
# The git server's git, with the repository's own commands off (config/catalog.yaml's git entry).
COPY --chmod=0755 config/git-zone/git /usr/local/lib/orchestrator/git-zone/git
COPY --chmod=0644 config/git-zone/sitecustomize.py /usr/local/lib/orchestrator/git-zone/sitecustomize.py
ENV HOME=/tmp
WORKDIR /workspace
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/orchestrator-mcp-proxy"]

# The agent: Claude Code (e2e/images/agent/package.json pins its version), the operator's
# default. It does not update itself and sends nothing but model requests (a TaskRun's
# agent.env can say otherwise); the operator runs it as `claude -p` with the rendered MCP config
# and settings (sh -c, so the image needs a shell).
FROM debian:bookworm-slim AS agent
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git \
 && rm -rf /var/lib/apt/lists/*
COPY --from=node:22-bookworm-slim /usr/local/bin/node /usr/local/bin/node
COPY --from=node:22-bookworm-slim /usr/local/lib/node_modules/npm /usr/local/lib/node_modules/npm
COPY e2e/images/agent/ /tmp/agent/
RUN cd /tmp/agent && node /usr/local/lib/node_modules/npm/bin/npm-cli.js ci --no-audit --no-fund \
 && install -m 0755 "node_modules/@anthropic-ai/claude-code-linux-$(node -p process.arch)/claude" /usr/local/bin/claude \
 && rm -rf /tmp/agent /usr/local/lib/node_modules /usr/local/bin/node /root/.npm \
 && mkdir -p /workspace && chown 65532:65532 /workspace
# The default agent script's result reader (operator/src/report), in every agent image.
COPY --from=build /out/orchestrator-agent /usr/local/bin/orchestrator-agent
ENV HOME=/tmp DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
WORKDIR /workspace
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/claude"]

# The other agent runtimes (docs/design/agent-runtimes.md), each from the npm package its
# e2e/images/agent-<runtime>/package.json pins (scripts/check-pins checks them), with only what
# its CLI runs, on the same base as `agent`; the operator runs them with the files it renders.
FROM node:22-bookworm-slim AS agent-npm-codex
COPY e2e/images/agent-codex/ /tmp/agent/
RUN cd /tmp/agent && npm ci --ignore-scripts --no-audit --no-fund \
 && cpu=$(node -p process.arch) && machine=$(case $cpu in x64) echo x86_64 ;; arm64) echo aarch64 ;; esac) \
 && vendor=node_modules/@openai/codex-linux-$cpu/vendor/$machine-unknown-linux-musl \
 && install -D -m 0755 "$vendor/bin/codex" /out/codex && install -D -m 0755 "$vendor/codex-path/rg" /out/rg
FROM node:22-bookworm-slim AS agent-npm-gemini
COPY e2e/images/agent-gemini/ /tmp/agent/
RUN cd /tmp/agent && npm ci --ignore-scripts --no-audit --no-fund
FROM node:22-bookworm-slim AS agent-npm-opencode
COPY e2e/images/agent-opencode/ /tmp/agent/
RUN cd /tmp/agent && npm ci --ignore-scripts --no-audit --no-fund

FROM debian:bookworm-slim AS agent-runtime-base
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /workspace && chown 65532:65532 /workspace
COPY --from=build /out/orchestrator-agent /usr/local/bin/orchestrator-agent
ENV HOME=/tmp
WORKDIR /workspace

# Codex CLI: its static musl binary (no Node at run time) and the rg it ships.
FROM agent-runtime-base AS agent-codex
COPY --from=agent-npm-codex /out/codex /usr/local/bin/codex
COPY --from=agent-npm-codex /out/rg /usr/local/bin/rg
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/codex"]

# Gemini CLI: its bundle on Node.js 22. It does not start itself a second time (its relaunch sizes
# the heap from the host's memory, not the container's limit).
FROM agent-runtime-base AS agent-gemini
COPY --from=node:22-bookworm-slim /usr/local/bin/node /usr/local/bin/node
COPY --from=agent-npm-gemini /tmp/agent/node_modules/@google/gemini-cli/package.json /opt/gemini-cli/package.json
COPY --from=agent-npm-gemini /tmp/agent/node_modules/@google/gemini-cli/bundle/ /opt/gemini-cli/bundle/
# Its system settings, the operator's: Gemini CLI reads them only from root's directories that
# nobody else writes (the task's ConfigMap is mounted group-writable), and the agent's script
# refuses to start when they are not the ConfigMap's copy.
COPY --chmod=0644 operator/src/render/runtime/gemini-settings.json /etc/gemini-cli/settings.json
RUN ln -s /opt/gemini-cli/bundle/gemini.js /usr/local/bin/gemini
ENV GEMINI_CLI_NO_RELAUNCH=true
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gemini"]

# OpenCode: its single linux-x64 binary (linux/amd64 only). It does not update itself or fetch its
# model list.
FROM agent-runtime-base AS agent-opencode
COPY --from=agent-npm-opencode /tmp/agent/node_modules/opencode-linux-x64/bin/opencode /usr/local/bin/opencode
ENV OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_LSP_DOWNLOAD=1 OPENCODE_DISABLE_SHARE=1
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/opencode"]

# Default: the operator.
FROM operator

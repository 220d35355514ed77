# syntax=docker/dockerfile:1
# gpu-node-agent: the node agent and the central services (correlator, dashboard, cordoner) in one image.
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg REVISION=$(git rev-parse HEAD) --build-arg CREATED=$(date -u +%FT%TZ) \
#     -t ghcr.io/gpu-node-agent/gpu-node-agent:0.1.0 --push .
# `make image` builds the same image without Docker or a registry base image (deploy/image/build.sh,
# docs/install.md). No architecture-specific step: both stages run on the target platform (QEMU or a
# native builder), pip picks that platform's wheels, hyperscan only where there is one (x86_64).
#
# The base is Debian bookworm's slim image pinned to an exact, dated tag (Debian's images are rebuilt
# with security updates under a new date); to pin the digest too, append @sha256:<digest> as printed by
# `docker buildx imagetools inspect debian:bookworm-20250520-slim`. make image builds from the same suite.
ARG BASE=debian:bookworm-20250520-slim

# --- 1: the wheelhouse: the project's wheel, its dependencies' wheels for this platform, pip's ----------
FROM ${BASE} AS wheels
ARG EXTRAS=fleet,kubernetes,cloudevents,nvsentinel,fast-scan
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /build && /build/bin/pip install --no-cache-dir --upgrade pip
COPY . /src
RUN /build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src \
 && /build/bin/pip wheel --no-cache-dir --prefer-binary --wheel-dir /wheels \
      "$(ls /wheels/gpu_node_agent-*.whl)[${EXTRAS}]" pip

# --- 2: the runtime: Debian's python3, a venv filled from the wheelhouse (no pip, no compiler) -----------
FROM ${BASE}
ARG BASE
ARG EXTRAS=fleet,kubernetes,cloudevents,nvsentinel,fast-scan
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
# The name the manifests use (deploy/kubernetes/): tag what you build as ${IMAGE}:${VERSION}.
ARG IMAGE=ghcr.io/gpu-node-agent/gpu-node-agent
# libhyperscan5 where Debian builds it (x86): its Hyperscan, built for every x86 instruction set (the NCCL log
# prefilter uses it before the fast-scan wheel's, built for baseline x86-64: collectors/nccl/libhs.py)
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates libstdc++6 \
      $(apt-cache show libhyperscan5 >/dev/null 2>&1 && echo libhyperscan5) \
 && rm -rf /var/lib/apt/lists/*
# The same script `make image` runs in its mmdebstrap root filesystem.
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    --mount=type=bind,source=deploy/image/install.sh,target=/install.sh \
    sh /install.sh /wheels "${EXTRAS}"
ENV PATH=/opt/gpu-node-agent/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Unprivileged by default: the correlator, dashboard and cordoner run as this user. The node agent's
# DaemonSet sets runAsUser: 0 (deploy/kubernetes/base/daemonset.yaml says why: /dev/kmsg, other users'
# /proc/<pid>/environ and job logs need its capabilities, which only root's processes get).
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/opt/gpu-node-agent/bin/gpu-node-agent"]
CMD ["--help"]
LABEL org.opencontainers.image.title="gpu-node-agent" \
      org.opencontainers.image.description="GPU data-plane node agent and its central services (correlator, dashboard, cordoner)" \
      org.opencontainers.image.source="https://github.com/gpu-node-agent/gpu-node-agent" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${BASE}"

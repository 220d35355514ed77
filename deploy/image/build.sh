#!/bin/sh
# `make image`: the Dockerfile's image, built without Docker and without a registry base image.
# Debian's mmdebstrap makes a minimal bookworm root filesystem (Essential packages, python3,
# ca-certificates, libstdc++6, libhyperscan5 on amd64) from the Debian archive, deploy/image/install.sh
# installs the wheelhouse into it (the same script the Dockerfile runs), and umoci packs it as a one-layer
# OCI image with the Dockerfile's config (entrypoint, user, labels). Output, under OUT (default build/image):
#   wheels/   the project's wheel and its dependencies' (this machine's architecture)
#   rootfs.tar  the root filesystem (the slow test unpacks it, chroots into it and runs `gpu-node-agent check`;
#               a tarball, not a directory: setuptools walks the source tree following symbolic links, and
#               a root filesystem's absolute links lead it into the host's /proc)
#   oci/      the OCI image layout, tag $VERSION: push with skopeo (docs/install.md)
# Root runs mmdebstrap in its root mode; another user in its unshare mode (needs /etc/subuid).
#   deploy/image/build.sh [wheels|rootfs|oci]    (default: all three, in that order)
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
PY=${PY:-$repo/.venv/bin/python}
OUT=${OUT:-$repo/build/image}
IMAGE=${IMAGE:-ghcr.io/gpu-node-agent/gpu-node-agent}
VERSION=${VERSION:-$("$PY" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$repo/pyproject.toml")}
EXTRAS=${EXTRAS:-fleet,kubernetes,cloudevents,nvsentinel,fast-scan}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
REVISION=${REVISION:-$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)}
CREATED=${CREATED:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}
step=${1:-all}

wheels() {
    rm -rf "$OUT/wheels" && mkdir -p "$OUT/wheels"
    "$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$OUT/wheels" "$repo"
    whl=$(ls "$OUT"/wheels/gpu_node_agent-"$VERSION"-*.whl)
    # Binary wheels where there are (pure-Python sdists such as nkeys are built into wheels here): an
    # architecture without a wheel for a C extension fails here (no compiler), not in the image.
    "$PY" -m pip wheel --quiet --disable-pip-version-check --prefer-binary --wheel-dir "$OUT/wheels" \
        "$whl[$EXTRAS]" pip
}

rootfs() {
    rm -f "$OUT/rootfs.tar"
    mode=root
    [ "$(id -u)" = 0 ] || mode=unshare
    # Documentation, man pages and locales are left out (copyright files kept), as in Debian's slim images.
    # libhyperscan5 on amd64, as in the Dockerfile (collectors/nccl/libhs.py)
    hs=""
    [ "$(dpkg --print-architecture)" = amd64 ] && hs=,libhyperscan5
    mmdebstrap --mode="$mode" --variant=essential --include="python3,ca-certificates,libstdc++6$hs" \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='mkdir -p "$1/var/cache/gna-wheels"' \
        --customize-hook="sync-in '$OUT/wheels' /var/cache/gna-wheels" \
        --customize-hook="upload '$here/install.sh' /var/cache/gna-wheels/install.sh" \
        --customize-hook="chroot \"\$1\" sh /var/cache/gna-wheels/install.sh /var/cache/gna-wheels '$EXTRAS'" \
        --customize-hook='rm -rf "$1/var/cache/gna-wheels" "$1/var/cache/apt/"*.bin "$1/var/log/"*.log' \
        "$SUITE" "$OUT/rootfs.tar" \
        "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main"
}

oci() {
    rm -rf "$OUT/oci"
    ref="$OUT/oci:$VERSION"
    bundle=$(mktemp -d "${TMPDIR:-/var/tmp}/gna-bundle.XXXXXX")
    trap 'rm -rf "$bundle"' EXIT
    umoci init --layout "$OUT/oci"
    umoci new --image "$ref"
    umoci unpack --image "$ref" "$bundle/b"
    tar -xf "$OUT/rootfs.tar" -C "$bundle/b/rootfs" --numeric-owner
    umoci repack --image "$ref" "$bundle/b"
    # The Dockerfile's ENTRYPOINT, USER, ENV and LABELs (tests/test_deploy_manifests.py compares them).
    umoci config --image "$ref" --os linux --architecture "$(dpkg --print-architecture)" \
        --config.user 65532:65532 --config.workingdir / \
        --config.entrypoint /opt/gpu-node-agent/bin/gpu-node-agent --config.cmd --help \
        --config.env PATH=/opt/gpu-node-agent/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --config.env PYTHONUNBUFFERED=1 --config.env PYTHONDONTWRITEBYTECODE=1 \
        --config.label org.opencontainers.image.title=gpu-node-agent \
        --config.label "org.opencontainers.image.description=GPU data-plane node agent and its central services (correlator, dashboard, cordoner)" \
        --config.label org.opencontainers.image.source=https://github.com/gpu-node-agent/gpu-node-agent \
        --config.label org.opencontainers.image.licenses=Apache-2.0 \
        --config.label "org.opencontainers.image.version=$VERSION" \
        --config.label "org.opencontainers.image.revision=$REVISION" \
        --config.label "org.opencontainers.image.created=$CREATED" \
        --config.label "org.opencontainers.image.base.name=debian:$SUITE (mmdebstrap)"
    umoci gc --layout "$OUT/oci"
    echo "built $ref ($IMAGE:$VERSION); push: skopeo copy oci:$ref docker://$IMAGE:$VERSION"
}

case $step in
    wheels) wheels ;;
    rootfs) rootfs ;;
    oci) oci ;;
    all) wheels && rootfs && oci ;;
    *) echo "usage: $0 [wheels|rootfs|oci]" >&2; exit 64 ;;
esac

#!/bin/sh
# Installs gpu-node-agent into the root filesystem this runs in: the Dockerfile's runtime stage runs it,
# and so does `make image` (deploy/image/build.sh) inside the mmdebstrap root filesystem, so both images
# hold the same thing. Needs only Debian's python3: the venv is made without pip and filled by pip run
# straight from its wheel in the wheelhouse, so neither pip nor python3-venv ends up in the image.
#   install.sh WHEELHOUSE EXTRAS
# WHEELHOUSE: the project's wheel, every dependency's wheel for this architecture and pip's wheel.
set -eu
wheels=$1
extras=$2
prefix=/opt/gpu-node-agent

python3 -m venv --without-pip "$prefix"
pip_whl=$(ls "$wheels"/pip-*.whl)
agent_whl=$(ls "$wheels"/gpu_node_agent-*.whl)
# --no-index: only what the wheelhouse holds (built beforehand, for this architecture); --no-compile
# then compileall: the .pyc files exist before the root filesystem is made read-only.
"$prefix/bin/python" "$pip_whl/pip" install --no-index --find-links "$wheels" --no-cache-dir \
    --disable-pip-version-check --no-warn-script-location --no-compile "${agent_whl}[${extras}]"
"$prefix/bin/python" -m compileall -q "$prefix/lib"
ln -sf "$prefix/bin/gpu-node-agent" /usr/local/bin/gpu-node-agent

# The unprivileged account of the central services (and the image's default USER): the same uid as
# distroless' "nonroot", which the manifests' runAsUser names.
grep -q '^nonroot:' /etc/group || echo 'nonroot:x:65532:' >> /etc/group
grep -q '^nonroot:' /etc/passwd || echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >> /etc/passwd
mkdir -p /home/nonroot /etc/gpu-node-agent /var/lib/gpu-node-agent
chown 65532:65532 /home/nonroot
chmod 0700 /var/lib/gpu-node-agent

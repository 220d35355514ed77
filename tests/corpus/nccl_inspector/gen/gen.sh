#!/bin/sh
# Regenerates tests/corpus/nccl_inspector/*.log and manifest.json with NCCL's own JSON writer.
# usage: gen.sh [NCCL git dir] [tag]   (default: the local mirror, v2.30.7-1; json.cc is the same
# code in every tag that has the Inspector, 2.28.3-1 on: only its licence header and a test macro's
# whitespace differ)
set -eu
GIT_DIR=${1:-/work/.mirror/NVIDIA+nccl/repo}
TAG=${2:-v2.30.7-1}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git --git-dir="$GIT_DIR" show "$TAG:plugins/profiler/inspector/json.cc" > "$tmp/json.cc"
git --git-dir="$GIT_DIR" show "$TAG:plugins/profiler/inspector/json.h" > "$tmp/json.h"
g++ -std=c++14 -O0 -Wall -I"$tmp" -o "$tmp/driver" "$here/driver.cc" "$tmp/json.cc"
rm -f "$here"/../*.log
"$tmp/driver" "$here/.."

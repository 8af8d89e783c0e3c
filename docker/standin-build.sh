#!/usr/bin/env bash
# Build the prores image with podman where no container registry is reachable (tests, CI):
# the NGC PyTorch base is replaced by a local stand-in - Debian bookworm from debootstrap, Python
# 3.11 in a venv, g++ (NGC has one), a CPU torch and NGC's pip constraint file pinning it - then the real Dockerfile is built on it.
#   bash docker/standin-build.sh [TAG]    # default: localhost/prores:standin
# pip inside the builds sees this machine's wheel cache and package indexes (read-only mounts of
# the PIP_FIND_LINKS / extra-index directories that `pip config list` names) and its CA bundle.
set -euo pipefail
tag=${1:-localhost/prores:standin}
base=localhost/prores-standin-base
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/docker/containers.conf}

mounts=(-v /etc/ssl/certs/ca-certificates.crt:/etc/host-ca.crt:ro)  # not over the image's own certs
for dir in $(pip config list 2>/dev/null | sed -n "s/^.*\(find-links\|extra-index-url\)='\(.*\)'$/\2/p" \
             | tr ' ' '\n' | sed 's|^file://||; s|/simple/*$||' | sort -u); do
  [ -d "$dir" ] && mounts+=(-v "$dir:$dir:ro")
done
pip_env=(--build-arg "PIP_FIND_LINKS=$(pip config get global.find-links 2>/dev/null || true)"
         --build-arg "PIP_EXTRA_INDEX_URL=$(pip config get global.extra-index-url 2>/dev/null || true)")

if ! podman image exists "$base"; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >&2
  tar -C "$work/rootfs" -c . | podman import - localhost/debian-minbase:bookworm >&2
  cat > "$work/Containerfile" <<'CONTAINERFILE'
FROM localhost/debian-minbase:bookworm
ARG PIP_FIND_LINKS=
ARG PIP_EXTRA_INDEX_URL=
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_CERT=/etc/host-ca.crt \
    PIP_FIND_LINKS=$PIP_FIND_LINKS PIP_EXTRA_INDEX_URL=$PIP_EXTRA_INDEX_URL
RUN pip install torch==2.13.0 && mkdir -p /etc/pip && pip freeze > /etc/pip/constraint.txt
CONTAINERFILE
  podman build "${mounts[@]}" "${pip_env[@]}" -t "$base" "$work" >&2
fi
podman build "${mounts[@]}" --build-arg "BASE_IMAGE=$base" -t "$tag" . >&2
echo "$tag"

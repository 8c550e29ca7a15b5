#!/usr/bin/env bash
# Build the attune image without a Docker daemon or registry access: Debian's buildah on a Debian bookworm root
# file system made with debootstrap (its python3 is 3.11, as the image's), tagged as the Dockerfile's base image.
#
#   docker/buildah-build.sh [TAG]        (default TAG: localhost/attune:dev; needs root, buildah and debootstrap)
#
# Environment:
#   ATTUNE_BASE_ROOTFS   where the bookworm root is kept between builds (default ~/.cache/attune/bookworm-rootfs)
#   DEBIAN_MIRROR        the Debian mirror (default: the one this machine's apt uses, else deb.debian.org)
#   DOCKERFILE           the Dockerfile (default Dockerfile, the full image; docker/Dockerfile.operator: the slim
#                        operator image, no torch)
#   TORCH_WHEELS         a folder of torch wheels to use before any index (default /opt/wheels where it exists):
#                        the image gets the CPU build without download.pytorch.org
#
# The base image gets this machine's CA bundle (/etc/ssl/certs/ca-certificates.crt), so builds behind a
# TLS-intercepting proxy work; build release images from python:3.11-slim with `docker build` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-localhost/attune:dev}
BASE=localhost/attune-base:bookworm-python3.11
ROOTFS=${ATTUNE_BASE_ROOTFS:-$HOME/.cache/attune/bookworm-rootfs}
MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { echo "buildah-build: $tool is not installed (apt-get install buildah debootstrap)" >&2; exit 2; }
done

if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
    echo "buildah-build: debootstrap bookworm into $ROOTFS from $MIRROR"
    rm -rf "$ROOTFS.partial" && mkdir -p "$(dirname "$ROOTFS")"
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates,passwd \
      bookworm "$ROOTFS.partial" "$MIRROR"
    mv "$ROOTFS.partial" "$ROOTFS"
  fi
  ctr=$(buildah from scratch)
  trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  mnt=$(buildah mount "$ctr")
  cp -a "$ROOTFS/." "$mnt/"
  # the build machine's trusted CAs (a TLS-intercepting proxy's among them), so pip inside the build reaches PyPI
  cp /etc/ssl/certs/ca-certificates.crt "$mnt/etc/ssl/certs/ca-certificates.crt"
  buildah umount "$ctr" >/dev/null
  # Debian marks its python externally managed; the image is a single-purpose one, so pip may install into it
  buildah config --env PIP_BREAK_SYSTEM_PACKAGES=1 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  buildah commit -q "$ctr" "$BASE" >/dev/null
  buildah rm "$ctr" >/dev/null
  trap - EXIT
  echo "buildah-build: base image $BASE"
fi

# torch wheels from this machine (the CPU build lies on disk) travel in the build context, ignored by git
rm -rf docker/wheels && mkdir -p docker/wheels
WHEELS=${TORCH_WHEELS:-/opt/wheels}
if [ -d "$WHEELS" ]; then
  find "$WHEELS" -maxdepth 1 -name 'torch-2.13.0*.whl' -exec cp {} docker/wheels/ \;
fi
buildah bud --isolation chroot --layers=false -q --build-arg "PYTHON_IMAGE=$BASE" \
  --build-arg "TORCH_INDEX_URL=https://pypi.org/simple" -t "$TAG" -f "${DOCKERFILE:-Dockerfile}" .
rm -rf docker/wheels
echo "buildah-build: built $TAG"

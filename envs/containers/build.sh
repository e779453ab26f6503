#!/usr/bin/env bash
# Build omicsprep's OCI image from a Debian base, with no registry:
#   envs/containers/build.sh cpu|gpu       (as root, with debootstrap and buildah: apt-get install debootstrap buildah)
# 1. debootstrap makes a minimal Debian root file system with Python (and STAR for the CPU image),
#    kept as build/containers/rootfs-<suite>.tar: bookworm (Python 3.11) for the CPU image, trixie
#    (Python 3.13) for the GPU one, as rapids-singlecell's wheels need Python 3.12 or later;
# 2. buildah imports it as localhost/omicsprep-base:<suite> and builds envs/containers/Containerfile
#    on it: image localhost/omicsprep-<flavor>:<version>;
# 3. the image is also written as an OCI archive, build/containers/omicsprep-<flavor>.tar, which
#    Apptainer turns into a .sif: apptainer build omicsprep-<flavor>.sif oci-archive://build/containers/omicsprep-<flavor>.tar
# Set DEBIAN_MIRROR for another mirror; where pip needs a CA bundle of its own (PIP_CERT), it is
# lent to the build and not kept in the image.
set -euo pipefail
cd "$(dirname "$0")/../.."
flavor=${1:?usage: envs/containers/build.sh cpu|gpu}
case $flavor in
  cpu) suite=bookworm packages=python3,python3-venv,ca-certificates,procps,rna-star ;;
  gpu) suite=trixie packages=python3,python3-venv,ca-certificates,procps ;;
  *) echo "envs/containers/build.sh: flavor $flavor: cpu or gpu" >&2; exit 2 ;;
esac
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image=localhost/omicsprep-$flavor:$version
build=build/containers
mkdir -p "$build"

rootfs=$build/rootfs-$suite.tar
if [ ! -s "$rootfs" ]; then
  tree=$(mktemp -d "$build/rootfs-$suite.XXXXXX")
  debootstrap --variant=minbase --include="$packages" "$suite" "$tree" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  rm -rf "$tree"/var/cache/apt/archives/*.deb "$tree"/var/lib/apt/lists/*
  tar -C "$tree" -cf "$rootfs.partial" . && mv "$rootfs.partial" "$rootfs"
  rm -rf "$tree"
fi
base=localhost/omicsprep-base:$suite
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  container=$(buildah from scratch)
  buildah add "$container" "$rootfs" /
  buildah config --env LANG=C.UTF-8 --cmd /bin/bash "$container"
  buildah commit --rm "$container" "$base"
fi

cert=()
if [ -n "${PIP_CERT:-}" ]; then
  cert=(--volume "$PIP_CERT:/run/pip-cert.pem:ro" --build-arg PIP_CERT=/run/pip-cert.pem)
fi
buildah bud --isolation chroot --layers -f envs/containers/Containerfile --build-arg BASE="$base" \
  --build-arg FLAVOR="$flavor" "${cert[@]}" -t "$image" .
rm -f "$build/omicsprep-$flavor.tar"
buildah push "$image" "oci-archive:$build/omicsprep-$flavor.tar:$image"
echo "built $image, and $build/omicsprep-$flavor.tar (OCI archive)"

#!/usr/bin/env bash
# Build drape's image where no registry serves base images (CI, these machines): a Debian 12 root file
# system made with debootstrap, imported into podman, then the Dockerfile's `debian` variant on it
# (Debian's Python 3.11, torch's CPU wheel from WHEELS, everything else from PyPI).
#   make image-test          this script, then the test that plays the rendered pods
#   infra/image/build.sh     this script alone; prints the seconds of each step and the image's size
# Cached: the base image is made once (`podman image exists`), the build reuses its layers and
# pip's download cache, so a second run with the same tree takes seconds.
# Needs root, podman, runc, catatonit and debootstrap (`make services` installs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/infra/image/containers.conf}"
BASE="${DEBIAN_BASE:-localhost/drape-base:bookworm}"
IMAGE="${IMAGE_TEST:-localhost/drape:test}"
WHEELS="${WHEELS:-/opt/wheels}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CA_BUNDLE="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"  # pip inside the build trusts what the host trusts

for tool in podman runc debootstrap; do
	command -v "$tool" >/dev/null || { echo "infra/image/build.sh: $tool is not installed (make services installs it)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "infra/image/build.sh: run as root (debootstrap and rootful podman)" >&2; exit 2; }

if podman image exists "$BASE"; then
	echo "base $BASE: cached"
else
	rootfs=$(mktemp -d /var/tmp/drape-rootfs.XXXXXX)
	trap 'rm -rf "$rootfs"' EXIT
	start=$SECONDS
	debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 \
		|| { tail -20 "$rootfs.log" >&2; echo "infra/image/build.sh: debootstrap failed (log: $rootfs.log)" >&2; exit 1; }
	echo "rootfs (debootstrap --variant=minbase bookworm): $((SECONDS - start)) s"
	start=$SECONDS
	tar -C "$rootfs" -c . | podman import --quiet - "$BASE" >/dev/null
	echo "base $BASE (podman import): $((SECONDS - start)) s"
	rm -rf "$rootfs" "$rootfs.log"
fi

# torch's CPU wheel from WHEELS when it is there (then PyTorch's index is never asked), else from that index
torch_index=()
if ! compgen -G "$WHEELS/torch-2.13.0+cpu-*.whl" >/dev/null; then
	[ -d "$WHEELS" ] || WHEELS=$(mktemp -d)
	echo "no torch 2.13.0+cpu wheel in $WHEELS: PyTorch's CPU index is asked"
else
	torch_index=(--build-arg TORCH_INDEX_URL=)
fi
# what its drape was installed from: the pod test refuses an image built from another tree
source_digest=$(python3 infra/image/source_digest.py)
start=$SECONDS
podman build --quiet --layers --build-arg VARIANT=debian --build-arg DEBIAN_BASE="$BASE" "${torch_index[@]}" \
	--label drape.source="$source_digest" \
	--build-context wheels="$WHEELS" --secret id=ca,src="$CA_BUNDLE" -t "$IMAGE" . >/dev/null
echo "image $IMAGE (podman build): $((SECONDS - start)) s"
echo "image size: $(podman image inspect --format '{{.Size}}' "$IMAGE") bytes"

#!/usr/bin/env bash
# Builds the FROM scratch image of deploy/Containerfile with podman: the static binary
# (deploy/build.sh), the machine's CA bundle, a passwd and group naming the image's user,
# and deploy/idlegate.toml, assembled in a temporary build context. Prints the image name.
#
#   deploy/image.sh [name]       (default localhost/idlegate:<version>)
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name=${1:-localhost/idlegate:$version}
binary=$(deploy/build.sh)
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$binary" "$context/idlegate"
bundle=/etc/ssl/certs/ca-certificates.crt
if [ -f "$bundle" ]; then
  cp "$bundle" "$context/ca-certificates.crt"
else
  echo "image.sh: no $bundle (Debian's ca-certificates): webhooks over TLS will not verify" >&2
  : >"$context/ca-certificates.crt"
fi
printf 'idlegate:x:65532:65532:idlegate:/nonexistent:/sbin/nologin\n' >"$context/passwd"
printf 'idlegate:x:65532:\n' >"$context/group"
# Names from /etc/hosts first, then DNS: what a statically linked glibc resolver needs told.
printf 'hosts: files dns\n' >"$context/nsswitch.conf"
cp deploy/idlegate.toml "$context/idlegate.toml"
podman build -q --format docker -f deploy/Containerfile -t "$name" "$context" >/dev/null
echo "$name"

#!/usr/bin/env bash
# image-rootfs.sh assembles the kvmesh runtime image's filesystem without a container daemon, from the same
# Debian packages as the Dockerfile's runtime stage (hack/image-packages.txt and their library dependencies),
# copies the kvmesh binary in, and checks that it runs there as the image's non-root user (uid 65532):
# every shared library resolves inside the root filesystem, and a simulator started in it answers over HTTP.
#   usage: hack/image-rootfs.sh [BINARY] [ROOTFS_DIR]      (needs root for chroot; apt-get as configured)
set -euo pipefail
bin=${1:-bin/kvmesh}
root=${2:-bin/rootfs}
[ -x "$bin" ] || { echo "image-rootfs: $bin not found (make build first)" >&2; exit 1; }
pkgs=$(grep -v '^#' "$(dirname "$0")/image-packages.txt")
# The library closure of the runtime packages (what `apt-get install --no-install-recommends` pulls in),
# without ca-certificates' maintainer-script tooling (debconf, openssl): its certificates are plain files.
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances --no-pre-depends libzmq5 | grep -E '^[a-z0-9]' | sort -u)
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
(cd "$dl" && apt-get download $closure $pkgs >/dev/null)
rm -rf "$root"
mkdir -p "$root"/{etc,tmp,usr/local/bin}
for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$root"; done
# ca-certificates ships the certificates; its postinst would build the bundle: do what it does.
if [ -d "$root/usr/share/ca-certificates" ]; then
  mkdir -p "$root/etc/ssl/certs"
  find "$root/usr/share/ca-certificates" -name '*.crt' -exec cat {} + > "$root/etc/ssl/certs/ca-certificates.crt"
fi
echo 'root:x:0:0:root:/root:/usr/sbin/nologin' > "$root/etc/passwd"
echo 'kvmesh:x:65532:65532:kvmesh:/nonexistent:/usr/sbin/nologin' >> "$root/etc/passwd"
printf 'root:x:0:\nkvmesh:x:65532:\n' > "$root/etc/group"
chmod 1777 "$root/tmp"
cp "$bin" "$root/usr/local/bin/kvmesh"
echo "image-rootfs: $(du -sh "$root" | cut -f1) in $root from $(ls "$dl" | wc -l) packages"

# 1. Every library the binary needs resolves inside the root filesystem (the loader of the rootfs, its paths only).
missing=$(chroot "$root" /lib64/ld-linux-x86-64.so.2 --list /usr/local/bin/kvmesh 2>&1 | grep -c 'not found' || true)
[ "$missing" = 0 ] || { chroot "$root" /lib64/ld-linux-x86-64.so.2 --list /usr/local/bin/kvmesh; exit 1; }
# 2. The entrypoint runs as the non-root user.
chroot --userspec=65532:65532 "$root" /usr/local/bin/kvmesh --help >/dev/null
# 3. A simulator in the image serves HTTP and publishes ZMQ (libzmq loaded for real).
port=$((20000 + RANDOM % 20000))
chroot --userspec=65532:65532 "$root" /usr/local/bin/kvmesh sim --http "127.0.0.1:$port" --kv-events "tcp://127.0.0.1:0" >"$dl/sim.log" 2>&1 &
sim=$!
ok=0
for _ in $(seq 1 100); do
  if curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null 2>&1; then ok=1; break; fi
  kill -0 "$sim" 2>/dev/null || break
  sleep 0.1
done
kill "$sim" 2>/dev/null || true
wait "$sim" 2>/dev/null || true
[ "$ok" = 1 ] || { echo "image-rootfs: the simulator did not answer in the rootfs:"; cat "$dl/sim.log"; exit 1; }
echo "image-rootfs: ok (libraries resolve, runs as uid 65532, sim answered on :$port)"

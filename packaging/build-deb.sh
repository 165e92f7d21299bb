#!/usr/bin/env bash
# packaging/build-deb.sh — build uiw_<version>_<arch>.deb with plain dpkg-deb.
#
#   packaging/build-deb.sh [OUTDIR]        (default OUTDIR: target/debian)
#
# Why dpkg-deb and not cargo-deb: dpkg-deb is part of dpkg, on every Debian
# machine and in every CI image already; cargo-deb would be one more tool to
# install and compile (minutes, on 2 cores) in CI, for a package whose layout
# is a dozen files. The layout is the one `uiw install` produces:
#
#   /usr/bin/uiw                                          the CLI
#   /usr/lib/<triplet>/libibverbs/libuiw-rdmav34.so       the provider (and its
#                                  libuiw-rdmav{57,...}.so links for newer rdma-core)
#   /etc/libibverbs.d/uiw.driver                          "driver uiw"
#   /usr/lib/<triplet>/uiw/libuiw_preload.so              the shim (uiw run)
#   /usr/lib/<triplet>/uiw/rdmacm/librdmacm.so.1          the librdmacm drop-in,
#                                  private: only `uiw run` puts it on LD_LIBRARY_PATH
#   /lib/systemd/system/uiw.service                       uiw up at boot
#   /etc/uiw/devices                                      ...of these netdevs
#   /usr/share/man/man8/uiw.8.gz, /usr/share/doc/uiw/     man page, copyright
#
# Environment: CARGO_PROFILE=release (default) or dev: which build to package;
# UIW_SKIP_BUILD=1: package what target/<profile>/ holds without building.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${1:-$root/target/debian}

profile_args=(--release)
profile_dir=release
if [[ "${CARGO_PROFILE:-release}" == dev ]]; then
	profile_args=()
	profile_dir=debug
fi
target=${CARGO_TARGET_DIR:-$root/target}/$profile_dir

if [[ "${UIW_SKIP_BUILD:-0}" != 1 ]]; then
	cargo build "${profile_args[@]}" -p uiw-cli -p uiw-provider -p uiw-preload -p uiw-rdmacm
fi

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
pkg=uiw_${version}_${arch}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
d=$stage/$pkg

for f in uiw libuiw_rdmav34.so libuiw_preload.so libuiw_rdmacm.so; do
	[[ -f "$target/$f" ]] || { echo "build-deb: $target/$f is missing (build first)" >&2; exit 1; }
done

# The libraries and the driver file: `uiw install` itself, into the staging
# tree, so the package has exactly its layout (the provider, its
# lib<name>-rdmav<PABI>.so links for newer rdma-core, the shim, the drop-in,
# /etc/libibverbs.d/uiw.driver).
mkdir -p "$d/usr/lib/$triplet/libibverbs"
UIW_INSTALL_ROOT=$d UIW_LIBDIR=$target "$target/uiw" install \
	--provider-dir "$d/usr/lib/$triplet/libibverbs" >&2
for f in "usr/lib/$triplet/libibverbs/libuiw-rdmav34.so" "usr/lib/$triplet/uiw/libuiw_preload.so" \
	"usr/lib/$triplet/uiw/rdmacm/librdmacm.so.1" etc/libibverbs.d/uiw.driver; do
	[[ -f "$d/$f" ]] || { echo "build-deb: uiw install did not install /$f" >&2; exit 1; }
done
install -D -m 0755 "$target/uiw" "$d/usr/bin/uiw"
install -D -m 0644 packaging/debian/devices "$d/etc/uiw/devices"
install -D -m 0644 packaging/debian/uiw.service "$d/lib/systemd/system/uiw.service"
mkdir -p "$d/usr/share/man/man8"
sed "s/@VERSION@/$version/" packaging/debian/uiw.8 | gzip -9n >"$d/usr/share/man/man8/uiw.8.gz"
install -D -m 0644 packaging/debian/copyright "$d/usr/share/doc/uiw/copyright"
# Debug builds are big; a release package is stripped.
if [[ $profile_dir == release ]]; then
	strip --strip-unneeded "$d/usr/bin/uiw" "$d/usr/lib/$triplet/libibverbs/libuiw-rdmav34.so" \
		"$d/usr/lib/$triplet/uiw/libuiw_preload.so" "$d/usr/lib/$triplet/uiw/rdmacm/librdmacm.so.1"
fi

mkdir -p "$d/DEBIAN"
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$d/DEBIAN/"
printf '%s\n' /etc/libibverbs.d/uiw.driver /etc/uiw/devices >"$d/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$d" | cut -f1)
cat >"$d/DEBIAN/control" <<CONTROL
Package: uiw
Version: $version
Architecture: $arch
Maintainer: uiw developers <uiw@localhost>
Installed-Size: $size
Depends: libc6 (>= 2.34), libgcc-s1, libibverbs1 (>= 36)
Recommends: librdmacm1, ibverbs-utils
Suggests: perftest, rdmacm-utils
Section: net
Priority: optional
Description: userspace software iWARP RDMA provider for rdma-core
 uiw gives a host an iWARP RDMA device without RDMA hardware and without a
 kernel module: a libibverbs provider that speaks RDMAP/DDP/MPA (RFC 5040,
 5041, 5044, 6581) over TCP inside the application's process, interoperating
 with other uiw processes and the kernel's siw.
 .
 This package holds the provider, the uiw command (uiw up publishes devices,
 uiw run starts unmodified programs on them), the LD_PRELOAD shim, a private
 librdmacm drop-in for rdma_cm programs under uiw run (the system's
 librdmacm is untouched), and uiw.service, which publishes the devices named
 in /etc/uiw/devices at boot.
CONTROL

mkdir -p "$out"
# --root-owner-group: files owned by root whoever builds; -Zxz: bookworm's default.
dpkg-deb --root-owner-group -Zxz --build "$d" "$out/$pkg.deb" >&2
echo "$out/$pkg.deb"

#!/usr/bin/env bash
# ci/apt-packages.sh — install the Debian packages listed in ci/packages.txt
# (the one list shared by ci/setup-and-run.sh and .ci/run).
#
#   ci/apt-packages.sh            install what is missing (root: apt-get;
#                                 otherwise through sudo)
#   ci/apt-packages.sh --list     print the list
#   ci/apt-packages.sh --missing  print the packages not installed (exit 0)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

list() { sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/packages.txt" | grep -v '^$'; }

missing() {
	local p
	for p in $(list); do
		# "install ok installed" only: a removed-but-not-purged package has
		# config-files status and is missing.
		if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) != "install ok installed" ]]; then
			echo "$p"
		fi
	done
}

case "${1:-}" in
--list) list; exit 0 ;;
--missing) missing; exit 0 ;;
"") ;;
*) echo "usage: $0 [--list|--missing]" >&2; exit 2 ;;
esac

mapfile -t need < <(missing)
if [[ ${#need[@]} -eq 0 ]]; then
	echo "apt-packages: all $(list | wc -l) packages of ci/packages.txt are installed" >&2
	exit 0
fi
echo "apt-packages: installing ${need[*]}" >&2

as_root=()
if [[ $(id -u) -ne 0 ]]; then
	if ! command -v sudo >/dev/null; then
		echo "apt-packages: these packages are missing and installing them needs root:" >&2
		echo "    apt-get install ${need[*]}" >&2
		exit 1
	fi
	as_root=(sudo)
fi

export DEBIAN_FRONTEND=noninteractive
# tshark's package asks whether non-root users may capture; answer "no" up
# front so the install never prompts.
echo "wireshark-common wireshark-common/install-setuid boolean false" |
	"${as_root[@]}" debconf-set-selections
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
	apt-get install -y --no-install-recommends "${need[@]}"

# ci/rust-toolchain.sh — sourced by ci/setup-and-run.sh and .ci/run: finds a
# Rust toolchain new enough for the workspace and puts it first on PATH, or
# says exactly what to do.
#
#   . ci/rust-toolchain.sh; uiw_find_cargo [USER]
#
# Looks at PATH, then $CARGO_HOME/bin, then USER's ~/.cargo/bin (USER: the one
# who ran `sudo`, so `sudo ./ci/setup-and-run.sh` finds a rustup toolchain
# although sudo resets PATH), then root's. The minimum version is the
# workspace's `rust-version` (Cargo.toml).

uiw_rust_min() {
	sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' \
		"$(dirname "${BASH_SOURCE[0]}")/../Cargo.toml" | head -1
}

# uiw_version_ge A B: is version A >= B (dotted numbers)?
uiw_version_ge() {
	[[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" == "$2" ]]
}

# uiw_with_rustup_home DIR CMD...: run CMD with RUSTUP_HOME set to the .rustup beside the
# .cargo/bin DIR, unless RUSTUP_HOME is set already or there is none.
uiw_with_rustup_home() {
	local d=$1
	shift
	if [[ -z "${RUSTUP_HOME:-}" && -d "$d/../../.rustup" ]]; then
		RUSTUP_HOME=$(cd "$d/../../.rustup" && pwd) "$@"
	else
		"$@"
	fi
}

uiw_find_cargo() {
	local user=${1:-} min dirs=() d home ver found=""
	min=$(uiw_rust_min)
	[[ -n "$min" ]] || min=1.88
	if command -v cargo >/dev/null 2>&1; then
		dirs+=("$(dirname "$(command -v cargo)")")
	fi
	[[ -z "${CARGO_HOME:-}" ]] || dirs+=("$CARGO_HOME/bin")
	if [[ -n "$user" ]]; then
		home=$(getent passwd "$user" | cut -d: -f6)
		[[ -z "$home" ]] || dirs+=("$home/.cargo/bin")
	fi
	[[ -z "${HOME:-}" ]] || dirs+=("$HOME/.cargo/bin")
	dirs+=(/root/.cargo/bin)
	local seen_old=""
	for d in "${dirs[@]}"; do
		[[ -x "$d/cargo" ]] || continue
		# A rustup proxy finds its toolchains through RUSTUP_HOME, which defaults to the
		# current $HOME's: under sudo that is root's, so probe with the owner's. A probe that
		# fails is an unusable candidate, not the end of this script (set -e).
		ver=$(uiw_with_rustup_home "$d" "$d/cargo" --version 2>/dev/null | awk '{print $2}') || ver=""
		ver=${ver%%-*}
		if [[ -n "$ver" ]] && uiw_version_ge "$ver" "$min"; then
			found=$d
			break
		fi
		seen_old="$seen_old $d/cargo ($ver)"
	done
	if [[ -z "$found" ]]; then
		{
			echo
			if [[ -n "$seen_old" ]]; then
				echo "uiw needs Rust >= $min; found only:$seen_old."
			else
				echo "uiw needs a Rust toolchain >= $min (cargo); none was found on PATH,"
				echo "in \$CARGO_HOME/bin or in ~/.cargo/bin${user:+ (of $user)}."
			fi
			echo "Debian 12's own rustc (1.63) is too old. Install a current toolchain with"
			echo "rustup, as the user who builds${user:+ ($user)} (not with sudo):"
			echo
			echo "    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y"
			echo "    . \"\$HOME/.cargo/env\""
			echo
			echo "or, with rustup already installed:  rustup update stable && rustup default stable"
			echo "Then run this command again."
		} >&2
		return 1
	fi
	export PATH="$found:$PATH"
	# rustup's proxies find their toolchains through RUSTUP_HOME/CARGO_HOME,
	# which default to the *current* $HOME: under sudo that is root's, so point
	# them at the owner's.
	if [[ -z "${RUSTUP_HOME:-}" && -d "$found/../../.rustup" ]]; then
		export RUSTUP_HOME
		RUSTUP_HOME=$(cd "$found/../../.rustup" && pwd)
	fi
	if [[ -z "${CARGO_HOME:-}" && "$(basename "$(dirname "$found")")" == .cargo ]]; then
		export CARGO_HOME
		CARGO_HOME=$(cd "$found/.." && pwd)
	fi
	echo "rust: $(cargo --version) at $found (need >= $min)" >&2
}

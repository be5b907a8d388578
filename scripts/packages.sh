#!/usr/bin/env bash
# scripts/packages.sh [--no-install-recommends] PACKAGE...: installs the Debian packages named
# that are not installed yet (apt-get update, then apt-get install -y, with the option when
# given), saying which on stderr; does nothing when all are.
# Everything it prints goes to stderr, so a script whose stdout is read can call it. The other
# scripts install what they need through it.
set -euo pipefail
options=()
if [ "${1:-}" = --no-install-recommends ]; then options+=("$1"); shift; fi
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ "${#missing[@]}" -gt 0 ] || exit 0
echo "packages: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update >&2
apt-get install -y "${options[@]}" "${missing[@]}" >&2

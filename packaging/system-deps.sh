#!/bin/sh
# Install the Debian packages the project needs, or say exactly how to.
# Usage: packaging/system-deps.sh [PACKAGE ...]   (default: the list in packaging/debian-packages.txt)
set -eu
here=$(dirname "$0")
if [ "$#" -gt 0 ]; then
    wanted="$*"
else
    wanted=$(grep -v '^#' "$here/debian-packages.txt" | tr -s ' \n' ' ')
fi
if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "system-deps: not a Debian/Ubuntu system; install the equivalents of: $wanted" >&2
    exit 0
fi
missing=""
for pkg in $wanted; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    case "$status" in
        *"install ok installed"*) ;;
        *) missing="$missing $pkg" ;;
    esac
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
    echo "system-deps: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $missing
else
    echo "system-deps: missing Debian packages:$missing" >&2
    echo "Run:  sudo apt-get install -y$missing" >&2
    echo "then run make again." >&2
    exit 1
fi

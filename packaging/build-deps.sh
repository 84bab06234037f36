#!/usr/bin/env bash
# Debian packages that packaging needs on the build/CI machine; installs only what is missing.
#   - libxcb-keysyms1, libxcb-icccm4: Qt's xcb platform plugin links them; when the build host has
#     them, PyInstaller bundles them, so the bundle opens a window on X11 desktops that lack them.
#   - desktop-file-utils, appstream: desktop-file-validate and appstreamcli (make validate-desktop).
#   - xvfb, xauth: the smoke test also starts the bundle on a real X server (xvfb-run).
# Needs root (CI and the dev machines run as root); prints what to install otherwise.
set -euo pipefail
want=(libxcb-keysyms1 libxcb-icccm4 desktop-file-utils appstream xvfb xauth)
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if ! command -v apt-get >/dev/null; then
    echo "packaging/build-deps.sh: not a Debian system; install the equivalents of: ${missing[*]}" >&2
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "packaging/build-deps.sh: run as root, or: sudo apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

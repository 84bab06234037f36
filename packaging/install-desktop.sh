#!/usr/bin/env bash
# Install the frozen bundle for the current user, with its launcher entry, icons and AppStream file:
#
#     packaging/install-desktop.sh [BUNDLE_DIR]        # default: dist/kvviz
#     packaging/install-desktop.sh --uninstall
#
# Puts the bundle in ~/.local/lib/kvviz, a `kvviz` link in ~/.local/bin, the .desktop entry (Exec=
# pointing at the bundle) in ~/.local/share/applications, the hicolor icons and the metainfo.
# Respects XDG_DATA_HOME and PREFIX (default ~/.local). No root needed.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
app_id=io.github.kvviz.KVViz
prefix="${PREFIX:-$HOME/.local}"
data="${XDG_DATA_HOME:-$prefix/share}"
libdir="$prefix/lib/kvviz"
bindir="$prefix/bin"

if [[ "${1:-}" == "--uninstall" ]]; then
    rm -rf "$libdir"
    rm -f "$bindir/kvviz" "$data/applications/$app_id.desktop" "$data/metainfo/$app_id.metainfo.xml"
    find "$data/icons/hicolor" -name "$app_id.*" -delete 2>/dev/null || true
    echo "removed kvviz from $prefix"
    exit 0
fi

bundle="${1:-$here/dist/kvviz}"
[[ -x "$bundle/kvviz" ]] || { echo "no bundle at $bundle: run 'make package' first" >&2; exit 2; }
res="$bundle/_internal/kvviz/resources"
[[ -d "$res" ]] || res="$here/resources"

mkdir -p "$libdir" "$bindir" "$data/applications" "$data/metainfo"
rm -rf "$libdir"
cp -a "$bundle" "$libdir"
ln -sfn "$libdir/kvviz" "$bindir/kvviz"
sed -e "s|^Exec=kvviz|Exec=$libdir/kvviz|" -e "s|^TryExec=kvviz|TryExec=$libdir/kvviz|" \
    "$res/$app_id.desktop" > "$data/applications/$app_id.desktop"
cp "$res/$app_id.metainfo.xml" "$data/metainfo/"
(cd "$res/icons" && find hicolor -name "$app_id.*" -exec install -D -m 644 {} "$data/icons/{}" \;)
command -v update-desktop-database >/dev/null && update-desktop-database -q "$data/applications" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$data/icons/hicolor" || true
echo "installed kvviz in $libdir; launcher: $data/applications/$app_id.desktop"

#!/bin/sh
# Add Omni Edge Studio to this user's application menu, run from the unpacked folder:
#   ./install-desktop-entry.sh            install (run it again after moving the folder)
#   ./install-desktop-entry.sh --remove   remove the menu entry and the icons
# Writes only under ${XDG_DATA_HOME:-~/.local/share}: applications/ and icons/hicolor/.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
entry=$data/applications/omni-edge-studio.desktop
png=$data/icons/hicolor/256x256/apps/omni-edge-studio.png
svg=$data/icons/hicolor/scalable/apps/omni-edge-studio.svg
case "${1:-}" in
    --remove)
        rm -f "$entry" "$png" "$svg"
        echo "removed $entry and the icons"
        exit 0
        ;;
    "") ;;
    *)
        echo "usage: $0 [--remove]" >&2
        exit 2
        ;;
esac
case "$here" in
    *[\"\`\$\\\|\&]*)
        echo "install-desktop-entry: the folder path $here holds one of \" \` \$ \\ | &," >&2
        echo "which a desktop entry cannot name; move the folder and run this again." >&2
        exit 1
        ;;
esac
mkdir -p "$(dirname "$entry")" "$(dirname "$png")" "$(dirname "$svg")"
cp "$here/omni-edge-studio.png" "$png"
cp "$here/omni-edge-studio.svg" "$svg"
sed -e "s|^Exec=.*|Exec=\"$here/omni-edge-studio\" %f|" \
    -e "s|^TryExec=.*|TryExec=$here/omni-edge-studio|" \
    "$here/omni-edge-studio.desktop" >"$entry.tmp"
mv "$entry.tmp" "$entry"
if command -v update-desktop-database >/dev/null 2>&1; then
    update-desktop-database -q "$(dirname "$entry")" || true
fi
echo "installed $entry (runs $here/omni-edge-studio)"

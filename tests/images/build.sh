#!/bin/sh
# Build a stand-in compiler image from a busybox-static rootfs plus the overlay folders given.
# usage: build.sh TAG OVERLAY_DIR...
# An overlay may hold a `.standin-remove` file: paths (relative to the image root, one a line) removed before that
# overlay is copied in, so a variant overlay can take files of an earlier one away (tests/images/acuity-nonplus).
set -eu
tag="$1"
shift

[ -x /bin/busybox ] || { echo "busybox-static is required (apt-get install busybox-static)" >&2; exit 3; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/usr/bin" "$root/tmp" "$root/root" "$root/etc" "$root/usr/lib/standin"
chmod 1777 "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
for overlay in "$@"; do
  if [ -f "$overlay/.standin-remove" ]; then
    while IFS= read -r gone; do [ -n "$gone" ] && rm -rf "${root:?}/$gone"; done < "$overlay/.standin-remove"
  fi
  cp -a "$overlay"/. "$root"/
  rm -f "$root/.standin-remove"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$root/etc/passwd"
printf 'root:x:0:\n' > "$root/etc/group"
tar -C "$root" -c . | docker import --change 'ENV PATH=/usr/bin:/bin' --change 'CMD ["tail", "-f", "/dev/null"]' - "$tag" >/dev/null
echo "built $tag"

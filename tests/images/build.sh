#!/bin/sh
# Build a stand-in compiler image from a busybox-static rootfs plus the overlay folders given.
# usage: build.sh [--if-changed] TAG OVERLAY_DIR...
# An overlay may hold a `.standin-remove` file: paths (relative to the image root, one a line) removed before that
# overlay is copied in, so a variant overlay can take files of an earlier one away (tests/images/acuity-nonplus).
# Every image is labelled with a hash of its inputs (this script, busybox, the overlays' files and modes); with
# --if-changed an image already under TAG with the same hash is kept (scripts/test: built once, reused while unchanged).
set -eu
reuse=0
[ "$1" = --if-changed ] && { reuse=1; shift; }
tag="$1"
shift

[ -x /bin/busybox ] || { echo "busybox-static is required (apt-get install busybox-static)" >&2; exit 3; }
label=io.saigeedge.standin-inputs
inputs=$({ cat "$0" /bin/busybox; for overlay in "$@"; do
  basename "$overlay"; tar -C "$overlay" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - .; done; } \
  | sha256sum | cut -c1-16)
if [ "$reuse" = 1 ] && [ "$(docker image inspect -f "{{index .Config.Labels \"$label\"}}" "$tag" 2>/dev/null)" = "$inputs" ]; then
  echo "reused $tag"
  exit 0
fi
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
tar -C "$root" -c . | docker import --change 'ENV PATH=/usr/bin:/bin' --change 'CMD ["tail", "-f", "/dev/null"]' \
  --change "LABEL $label=$inputs" - "$tag" >/dev/null
echo "built $tag"

#!/bin/sh
# Stand-in for Mobilint qb Compiler 1.3 (`python3 -m qbcompiler`, tests only). It checks argv and the exact
# target-device strings like the real CLI, reads calib.txt and every .npy it lists, writes .mblt/.mxq where
# asked, and with QBCOMPILER_JSONL=1 reports as JSON lines (status, progress, result, log, error).
# Like 1.3 it answers `--version`, takes `--device cpu|gpu` (its config's device defaults to gpu), writes the
# resolved config where `--config-save-path` says before compiling, reads MBLT_HL_PARSER_NUM_WORK (a positive
# integer; recorded in that config) and prints a .mblt's provenance as JSON for `info --mblt F`.
# Failure modes, chosen by a word in the model name: qbfail (an `error` event, exit 1), qbnooutput (exit 0,
# no output file), qbhang (never returns), slow (3 s per step); qblink is no tool's but a hostile step's: its .mxq is
# a symbolic link to the daemon's database (../../../saigeedged.db from <state_dir>/work/<job>/attempt<N>/), a path
# the container cannot see but the daemon would follow.
set -u
# every call is recorded (cwd, then argv) so a test can count what really ran in this container
printf '%s %s %s\n' "$(pwd)" "qbcompiler" "$*" >> /tmp/standin-calls.log 2>/dev/null || true
jsonl="${QBCOMPILER_JSONL:-0}"
say() { [ "$jsonl" = 1 ] && printf '{"type": "%s", %s}\n' "$1" "$2" || echo "$3" >&2; }
error() { if [ "$jsonl" = 1 ]; then printf '{"type": "error", "code": "%s", "message": "%s"}\n' "$1" "$2"; else echo "ERROR [$1]: $2" >&2; fi; exit "${3:-1}"; }
get() { eval "printf '%s' \"\${opt_$1:-}\""; }

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  --help|-h|"") echo "usage: qbcompiler {compile,parse,quantize,dump-config,presets,info,check} ..."; exit 0 ;;
  --version) echo "qbcompiler 1.3.0"; exit 0 ;;
  parse) allowed="--model --backend --target-device --config-preset --output --device" ;;
  quantize) allowed="--mblt --calib-data-path --target-device --config-preset --compile-config --output --device --config-save-path" ;;
  info) allowed="--mblt" ;;
  *) error ARGUMENT_ERROR "unknown command '$cmd'" 2 ;;
esac
while [ $# -gt 0 ]; do
  flag="$1"
  shift
  case " $allowed " in
    *" $flag "*) [ $# -gt 0 ] || error ARGUMENT_ERROR "argument $flag: expected one argument" 2
                 key=$(echo "${flag#--}" | tr - _); eval "opt_$key=\$1"; shift ;;
    *) error ARGUMENT_ERROR "unrecognized arguments: $flag" 2 ;;
  esac
done
workers="${MBLT_HL_PARSER_NUM_WORK:-}"
case "$workers" in
  "") workers=default ;;
  *[!0-9]*|0) error INTERNAL_ERROR "ValueError: MBLT_HL_PARSER_NUM_WORK must be a positive integer, got '$workers'" ;;
esac
if [ "$cmd" = info ]; then
  mblt=$(get mblt)
  [ -f "$mblt" ] || error ARGUMENT_ERROR "no such file: '$mblt'" 2
  [ "$(head -c 4 "$mblt")" = MBLT ] || error ARGUMENT_ERROR "not a .mblt file: '$mblt'" 2
  printf '{"file": "%s", "format": "mblt", "bytes": %s, "qbcompiler": "1.3.0", "backend": "onnx"}\n' \
    "$(basename "$mblt")" "$(wc -c < "$mblt" | tr -d ' ')"
  exit 0
fi
run_on=$(get device)
case "$run_on" in
  "") run_on=gpu ;;
  cpu|gpu) ;;
  *) error ARGUMENT_ERROR "argument --device: invalid choice: '$run_on' (choose from 'cpu', 'gpu')" 2 ;;
esac
device=$(get target_device)
case "$device" in
  aries-rb|regulus-ra|regulus-rb|regulus-rb-usb) ;;
  *) error ARGUMENT_ERROR "invalid target device '$device' (aries-rb, regulus-ra, regulus-rb, regulus-rb-usb)" 2 ;;
esac
preset=$(get config_preset)
case "$preset" in
  ""|classification|classification_torchvision|detection|yolo_640|yolo_1280|llm|llm_fast|vision_transformer|multimodal) ;;
  *) error ARGUMENT_ERROR "unknown config preset '$preset'" 2 ;;
esac
out=$(get output)
[ -n "$out" ] || error ARGUMENT_ERROR "the following arguments are required: --output" 2
src=$(get model)
[ "$cmd" = quantize ] && src=$(get mblt)
[ -f "$src" ] || error ARGUMENT_ERROR "no such file: '$src'" 2
case "$src" in *qbhang*) exec sleep 100000 ;; *slow*) sleep 3 ;; esac
say status "\"stage\": \"$cmd\", \"device\": \"$device\"" "I $cmd for $device"
if [ "$cmd" = parse ]; then
  [ "$(get backend)" = onnx ] || error ARGUMENT_ERROR "unsupported backend '$(get backend)'" 2
  case "$src" in *qbfail*) error INTERNAL_ERROR "unsupported layer 'If' in the middle of the graph (simplify first)" ;; esac
  say progress '"stage": "parse", "progress": 1.0' "I parsed"
  case "$src" in *qbnooutput*) exit 0 ;; esac
  { printf 'MBLT'; cat "$src"; } > "$out"
else
  saved=$(get config_save_path)
  if [ -n "$saved" ]; then  # written before compiling: kept even when the compile fails
    printf 'device: %s\ntarget_device: %s\nconfig_preset: %s\ncalib_data_path: %s\nparser_num_work: %s\n' \
      "$run_on" "$device" "${preset:-null}" "$(get calib_data_path)" "$workers" > "$saved" \
      || error OUTPUT_WRITE_ERROR "cannot write $saved"
  fi
  calib=$(get calib_data_path)
  [ -f "$calib" ] || error ARGUMENT_ERROR "No calibration dataset is provided" 2
  n=0
  total=$(grep -c . "$calib")
  while IFS= read -r npy; do
    [ -f "$npy" ] || error ARGUMENT_ERROR "calibration file not found: $npy" 2
    [ "$(head -c 6 "$npy" | tail -c 5)" = NUMPY ] || error ARGUMENT_ERROR "not a .npy file: $npy" 2
    n=$((n + 1))
    say progress "\"stage\": \"calibration\", \"done\": $n, \"total\": $total" "I calibration $n/$total"
  done < "$calib"
  [ "$n" -gt 0 ] || error ARGUMENT_ERROR "No calibration dataset is provided" 2
  case "$src" in *qbnooutput*) exit 0 ;; esac
  { printf 'MXQ1%s' "$device"; cat "$src"; } > "$out"
  case "$src" in *qblink*) ln -sf ../../../saigeedged.db "$out" ;; esac
fi
say result "\"output\": \"$out\"" "I wrote $out"
exit 0

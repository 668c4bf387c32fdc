#!/usr/bin/env bash
# Packs the built binaries with the shared libraries they load, for a GPU machine that has the NVIDIA
# driver and CUDA's libraries but not this build's Debian packages (yaml-cpp, fmt, OpenBLAS, cairo...):
#   scripts/gpu_bundle.sh [BUILD_DIR] [ARCHIVE]      (defaults: build, .bundle/kvbench.tar.xz)
# The archive (about 15 MB) holds bin/kvbench, bin/kvbench_tests, lib/ (what ldd lists, but the C
# library's own and CUDA's) and env.sh. On the GPU machine, from the repository root:
#   mkdir -p /tmp/kvb && tar xJf .bundle/kvbench.tar.xz -C /tmp/kvb && . /tmp/kvb/env.sh
#   KVBENCH_REQUIRE_GPU=1 kvbench_tests "[cuda]"; scripts/gpu_bench.sh /tmp/kvb/bin
# env.sh puts bin/ on PATH and, on LD_LIBRARY_PATH, the packed libraries the machine lacks (and the
# packed OpenBLAS) and CUDA's runtime and cuBLAS (a toolkit's lib64, or the nvidia-* wheels' lib folders).
set -euo pipefail
build=${1:-build}
archive=${2:-.bundle/kvbench.tar.xz}
bins=("$build/kvbench" "$build/tests/kvbench_tests")
for b in "${bins[@]}"; do [[ -x $b ]] || { echo "gpu_bundle: $b not found; build first (scripts/setup.sh)" >&2; exit 1; }; done
grep -q "KVBENCH_CUDA:BOOL=ON" "$build/CMakeCache.txt" 2> /dev/null ||
  echo "gpu_bundle: warning: $build was configured without CUDA; the binaries will not use a GPU" >&2

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "${bins[@]}" "$stage/bin/"
missing=$(ldd "${bins[@]}" | awk '/not found/ {print $1}' | sort -u)
[[ -z $missing ]] || { echo "gpu_bundle: libraries not found here: $missing" >&2; exit 1; }
ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv)\.so|/ld-linux|/libcuda\.so|/libcudart\.so|/libcublas(Lt)?\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done

cat > "$stage/env.sh" << 'EOF'
# Source me: kvbench's binaries and the libraries they need on this machine.
kvb_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$kvb_dir/use"
for f in "$kvb_dir"/lib/*; do
  n=$(basename "$f")
  # The machine's own copy wins (its CUDA libraries may need its newer C++ runtime), but for OpenBLAS:
  # ours is the OpenMP build, which shares the OpenMP threads instead of fighting them.
  if [[ $n == libopenblas* ]] || ! ldconfig -p | grep -q "^[[:space:]]*$n "; then ln -sf "$f" "$kvb_dir/use/$n"; fi
done
kvb_cuda=$(python3 - 2> /dev/null << 'PY'
import glob, os, site
dirs = set()
for base in site.getsitepackages():
    for name in ("libcudart.so.*", "libcublas.so.*", "libcublasLt.so.*"):
        dirs.update(os.path.dirname(p) for p in glob.glob(os.path.join(base, "nvidia", "**", name), recursive=True))
print(":".join(sorted(dirs)))
PY
)
for c in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [[ -d $c ]] && kvb_cuda="$kvb_cuda:$c"; done
export PATH="$kvb_dir/bin:$PATH"
export LD_LIBRARY_PATH="$kvb_dir/use:${kvb_cuda#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$kvb_dir/bin/kvbench" | grep -q "not found"; then
  echo "env.sh: still missing:" $(ldd "$kvb_dir/bin/kvbench" | awk '/not found/ {print $1}') >&2
fi
EOF

mkdir -p "$(dirname "$archive")"
tar cJf "$archive" -C "$stage" .
echo "$archive: $(du -k "$archive" | cut -f1) KiB ($(ls "$stage/lib" | wc -l) libraries); the checkout holds" \
  "$(git ls-files -z | xargs -0 stat -c %s 2> /dev/null | awk '{s += $1} END {printf "%.1f", s / 1048576}') MiB"

#!/usr/bin/env bash
# The C++ sources follow .clang-format. Formatting differs between clang-format releases, so the check
# runs with the release the tree was formatted with (14, Debian 12's) and is skipped (exit 77) without it.
# To format: clang-format-14 -i FILES.
set -euo pipefail
cd "$(dirname "$0")/.."
tool=$(command -v clang-format-14 || true)
if [[ -z "$tool" ]] && command -v clang-format >/dev/null && clang-format --version | grep -q 'version 14\.'; then
  tool=$(command -v clang-format)
fi
if [[ -z "$tool" ]]; then
  echo "clang-format 14 not found; skipped"
  exit 77
fi
mapfile -t files < <(find harness kernels methods tasks tests python fuzz examples \
  -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) 2>/dev/null | sort)
"$tool" --dry-run -Werror "${files[@]}"
echo "${#files[@]} files follow .clang-format"

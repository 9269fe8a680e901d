#!/usr/bin/env bash
# Builds FerretDB v1.24.2 (MongoDB wire protocol on SQLite) into .tools/bin/ferretdb. Idempotent.
#
# Why not a bare `go install …/cmd/ferretdb@v1.24.2`: on this kind of machine the module proxy refuses the
# module's version *list*, which `go install pkg@version` reads for its deprecation check, and the published
# module lacks build/version/version.txt, so any module-mode build panics at start. We therefore fetch that exact
# version with `go mod download` and build it from its own source with the version file written, which is what
# FerretDB's own build does (`task gen-version`).
set -euo pipefail
VERSION=v1.24.2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/.tools/bin/ferretdb"

if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "version: $VERSION"; then
  exit 0
fi
export PATH="$PATH:/usr/local/go/bin:$HOME/go/bin"
if ! command -v go >/dev/null 2>&1; then
  echo "install-ferretdb: Go is needed to build FerretDB $VERSION and was not found" >&2
  exit 1
fi
mkdir -p "$ROOT/.tools/bin"
start=$(date +%s)
if GOBIN="$ROOT/.tools/bin" go install "github.com/FerretDB/FerretDB/cmd/ferretdb@$VERSION" 2>/dev/null \
   && "$BIN" --version >/dev/null 2>&1; then
  echo "install-ferretdb: built with go install in $(( $(date +%s) - start ))s"
  exit 0
fi
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
dir="$(GOFLAGS=-mod=mod go mod download -json "github.com/FerretDB/FerretDB@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -n "$dir" ] || { echo "install-ferretdb: go mod download gave no source directory" >&2; exit 1; }
cp -r "$dir" src
chmod -R u+w src
echo "$VERSION" > src/build/version/version.txt
(cd src && go build -trimpath -o "$BIN" ./cmd/ferretdb)
"$BIN" --version | head -1
echo "install-ferretdb: built from module source in $(( $(date +%s) - start ))s"

#!/usr/bin/env bash
# Builds FerretDB v1.24.2 (MongoDB wire protocol on SQLite) into .tools/bin/ferretdb. Idempotent.
#
# Why not a bare `go install …/cmd/ferretdb@v1.24.2`: on this kind of machine the module proxy refuses the
# module's version *list*, which `go install pkg@version` reads for its deprecation check, and the published
# module lacks build/version/version.txt, so any module-mode build panics at start. We therefore fetch that exact
# version with `go mod download` and build it from its own source with the version file written, which is what
# FerretDB's own build does (`task gen-version`).
#
# One change to that source (ID_INDEX_PATCH below): FerretDB's SQLite backend looks `_id` up through the expression
# `_ferretdb_sjson->'$._id'`, while the `_id` index it creates is on `_ferretdb_sjson->"_id"`. SQLite uses an
# expression index only for the very same expression, so unpatched, even `findOne({_id})` scans the whole table
# (159 ms at 34,000 documents; 1-2 ms at any size once the expressions match). We set the lookup expression to the
# index's own. scripts/services.sh refuses to start a binary built without it.
set -euo pipefail
VERSION=v1.24.2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/.tools/bin/ferretdb"

# The patched lookup expression is a string constant in the binary: its presence tells a patched build (the
# unpatched constant stays in any build, as the MySQL backend uses it too).
PATCHED_ID_LOOKUP='_ferretdb_sjson->"_id"'

if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "version: $VERSION" && grep -qaF "$PATCHED_ID_LOOKUP" "$BIN"; then
  exit 0
fi
export PATH="$PATH:/usr/local/go/bin:$HOME/go/bin"
if ! command -v go >/dev/null 2>&1; then
  echo "install-ferretdb: Go is needed to build FerretDB $VERSION and was not found" >&2
  exit 1
fi
mkdir -p "$ROOT/.tools/bin"
start=$(date +%s)
echo "install-ferretdb: building FerretDB $VERSION from its module source (first start only; about 1-3 minutes)" >&2
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
dir="$(GOFLAGS=-mod=mod go mod download -json "github.com/FerretDB/FerretDB@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -n "$dir" ] || { echo "install-ferretdb: go mod download gave no source directory" >&2; exit 1; }
echo "install-ferretdb: source downloaded ($(( $(date +%s) - start ))s); patching its _id lookup and compiling" >&2
cp -r "$dir" src
chmod -R u+w src
echo "$VERSION" > src/build/version/version.txt
metadata=src/internal/backends/sqlite/metadata/metadata.go
grep -qF 'IDColumn = DefaultColumn + "->'"'"'$._id'"'"'"' "$metadata" \
  || { echo "install-ferretdb: IDColumn line not found in $metadata; cannot apply the _id index patch" >&2; exit 1; }
# ID_INDEX_PATCH: look _id up with the `_id` index's own expression.
perl -pi -e 's/IDColumn = DefaultColumn \+ "->\x27\$\._id\x27"/IDColumn = DefaultColumn + "->\\"_id\\""/' "$metadata"
grep -qF 'IDColumn = DefaultColumn + "->\"_id\""' "$metadata" || { echo "install-ferretdb: _id index patch did not apply" >&2; exit 1; }
# The compile is the long part: say it is still going every 15 s.
(while sleep 15; do echo "install-ferretdb: still compiling ($(( $(date +%s) - start ))s)" >&2; done) &
ticker=$!
# (|| true: under set -e a failing command in the EXIT trap would become the script's exit status)
trap 'kill "$ticker" 2>/dev/null || true; chmod -R u+w "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
(cd src && go build -trimpath -o "$BIN" ./cmd/ferretdb)
kill "$ticker" 2>/dev/null || true
"$BIN" --version | sed -n 1p  # not head: with pipefail, --version killed by SIGPIPE would fail the build
echo "install-ferretdb: built from module source in $(( $(date +%s) - start ))s"

#!/usr/bin/env bash
# Schemathesis (from PyPI, pinned) in a virtualenv of the project's own, for test/contract/schemathesis.test.ts.
# Idempotent: does nothing when the pinned version is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION=4.32.5
VENV="$ROOT/.tools/schemathesis"
if [ -x "$VENV/bin/st" ] && "$VENV/bin/st" --version 2>/dev/null | grep -q "$VERSION"; then exit 0; fi
if ! python3 -m venv --help >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$VERSION"
"$VENV/bin/st" --version

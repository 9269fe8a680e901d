#!/usr/bin/env bash
# The standards' own test tools (test/peers/), pinned, installed into the checkout: the Python ones in a virtualenv
# at .tools/venv, the MCP conformance runner under .tools/mcp-conformance. Idempotent: does nothing when the pinned
# versions are already there. x402lint needs Python >= 3.12, so the venv is made with the newest Python found.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
X402_CONFORMANCE=1.6.0
X402LINT=0.5.2
# 0.1.11 is the last release that runs on Node 20; later ones need Node 22.
MCP_CONFORMANCE=0.1.11
VENV="$ROOT/.tools/venv"
MCP_DIR="$ROOT/.tools/mcp-conformance"

python_312() {
  local candidate
  for candidate in python3.13 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  # pyenv keeps other versions out of PATH unless asked.
  if command -v pyenv >/dev/null 2>&1; then
    for candidate in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])' | sort -rV); do
      if [ -x "$(pyenv root)/versions/$candidate/bin/python3" ]; then echo "$(pyenv root)/versions/$candidate/bin/python3"; return 0; fi
    done
  fi
  return 1
}

installed() {
  "$VENV/bin/python" -m pip show "$1" 2>/dev/null | grep -qx "Version: $2"
}

if ! { [ -x "$VENV/bin/python" ] && installed x402-conformance "$X402_CONFORMANCE" && installed x402lint "$X402LINT"; }; then
  PY="$(python_312)" || { echo "install-peer-tools: x402lint $X402LINT needs Python >= 3.12, none found" >&2; exit 1; }
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "x402-conformance==$X402_CONFORMANCE" "x402lint==$X402LINT"
fi

if ! grep -q "\"version\": \"$MCP_CONFORMANCE\"" "$MCP_DIR/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null; then
  rm -rf "$MCP_DIR"
  mkdir -p "$MCP_DIR"
  # Its own prefix, out of the project's package.json: it is a tool, not a dependency of the service.
  npm install --prefix "$MCP_DIR" --no-audit --no-fund --no-save --silent "@modelcontextprotocol/conformance@$MCP_CONFORMANCE"
fi

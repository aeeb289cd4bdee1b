#!/usr/bin/env bash
# CI: regenerate the protobuf code and fail if it differs from what is committed; lint the protos.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/gen_proto.sh >/dev/null
git status --porcelain -- tether/responses/v1 | grep . && { echo "generated code is stale: run scripts/gen_proto.sh"; git diff --stat -- tether/responses/v1; exit 1; }
buf lint
buf format --diff --exit-code
echo "proto: generated code fresh, buf lint and format clean"

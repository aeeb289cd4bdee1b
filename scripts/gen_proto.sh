#!/usr/bin/env bash
# The one place generated protobuf code comes from: proto/ -> tether/responses/v1/*_pb2*.py(i).
# CI runs it and fails on a diff (scripts/check_generated.sh). Never edit the outputs by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
out=tether/responses/v1
rm -f "$out"/*_pb2.py "$out"/*_pb2.pyi "$out"/*_pb2_grpc.py "$out"/*_pb2_grpc.pyi
"$PY" -m grpc_tools.protoc -Iproto \
  --python_out=. --grpc_python_out=. \
  --mypy_out=. --mypy_grpc_out=only_async:. \
  proto/tether/responses/v1/*.proto
# Only service.proto defines a service; protoc still writes empty *_pb2_grpc files for the others.
for f in "$out"/*_pb2_grpc.py "$out"/*_pb2_grpc.pyi; do
  case "$f" in */service_pb2_grpc.py|*/service_pb2_grpc.pyi) ;; *) rm -f "$f" ;; esac
done

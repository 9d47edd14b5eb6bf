#!/bin/sh
# gen.sh OUT: writes the Python code generated from the trainer contract's
# .proto files (shared/plugin/internal/pluginpb) into OUT, as
# cohort_plugin/_pb holds it. protoc names a module by its .proto's path
# from the repository root; the package imports its siblings relatively.
# Run from the repository root (make proto, make proto-check).
set -eu
out=$1
plugin=$(command -v grpc_python_plugin) || { echo "gen.sh: grpc_python_plugin not found (Debian: protobuf-compiler-grpc)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pb=shared/plugin/internal/pluginpb
protoc -I . --python_out="$tmp" $pb/arena.proto $pb/trainer.proto
protoc -I . --grpc_python_out="$tmp" --plugin=protoc-gen-grpc_python="$plugin" $pb/trainer.proto
mkdir -p "$out"
for f in arena_pb2.py trainer_pb2.py trainer_pb2_grpc.py; do
  sed -e 's/^from shared\.plugin\.internal\.pluginpb import /from . import /' "$tmp/$pb/$f" > "$out/$f"
done

#!/usr/bin/env bash
# Regenerates Sources/AttuneSpec/Generated from the .proto files here.
# Run by hand after editing a .proto and commit the result; CI never runs it.
# Needs Debian's protobuf-compiler and swift-protobuf's plugin at the version Package.swift names:
#   git clone https://github.com/apple/swift-protobuf && cd swift-protobuf && git checkout 1.39.0
#   swift build -c release --product protoc-gen-swift
# (or from the checkout SwiftPM already has: swift build --package-path .build/checkouts/swift-protobuf --product protoc-gen-swift)
# UseAccessLevelOnImports: the generated files say `public import`, as every target builds with InternalImportsByDefault.
#   PROTOC_GEN_SWIFT=$PWD/.build/release/protoc-gen-swift Protos/generate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
plugin=${PROTOC_GEN_SWIFT:-$(command -v protoc-gen-swift)}
protoc --plugin=protoc-gen-swift="$plugin" --swift_opt=Visibility=Public --swift_opt=UseAccessLevelOnImports=true \
  --swift_out=Sources/AttuneSpec/Generated -I Protos Protos/CoreMLSubset.proto Protos/attune.proto

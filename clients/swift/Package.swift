// swift-tools-version:5.9
// AttuneClient: fetch a user's personalized Core ML model from `attune serve` and upload what the device
// trained. No package dependencies: Foundation (URLSession) only, on Apple platforms and on Linux.
import PackageDescription

let package = Package(
    name: "AttuneClient",
    platforms: [.iOS(.v15), .macOS(.v12), .tvOS(.v15), .watchOS(.v8), .visionOS(.v1)],
    products: [
        .library(name: "AttuneClient", targets: ["AttuneClient"]),
    ],
    targets: [
        .target(
            name: "AttuneClient",
            swiftSettings: [.enableExperimentalFeature("StrictConcurrency")]),
        .testTarget(
            name: "AttuneClientTests",
            dependencies: ["AttuneClient"],
            exclude: ["Fixtures"],
            swiftSettings: [.enableExperimentalFeature("StrictConcurrency")]),
    ]
)

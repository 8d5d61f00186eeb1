// swift-tools-version:6.0
// The job decoder and validator under libFuzzer, kept out of the main package so its build is unaffected.
// Build and run it with scripts/fuzz.sh.
import PackageDescription

let package = Package(
    name: "AttuneFuzz",
    dependencies: [
        .package(name: "Attune", path: ".."),
    ],
    targets: [
        .executableTarget(name: "FuzzJobDecoder", dependencies: [
            .product(name: "AttuneJobs", package: "Attune"),
        ]),
    ],
    swiftLanguageModes: [.v6]
)

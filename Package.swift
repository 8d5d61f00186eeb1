// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Attune",
    platforms: [.macOS(.v13)],
    products: [
        .executable(name: "attune", targets: ["attune"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-protobuf", from: "1.39.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
    ],
    targets: [
        .systemLibrary(name: "CRabbitMQ", pkgConfig: "librabbitmq",
                       providers: [.apt(["librabbitmq-dev"])]),
        .systemLibrary(name: "CLibPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .systemLibrary(name: "CBLAS", providers: [.apt(["libblas-dev"])]),

        .target(name: "AttuneSpec",
                dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf")]),
        .target(name: "AttuneTraining", dependencies: ["AttuneSpec", "CBLAS"]),
        .target(name: "AttuneStore", dependencies: ["AttuneSpec", "CLibPQ",
                                                    .product(name: "Logging", package: "swift-log")]),
        .target(name: "AttuneQueue", dependencies: ["AttuneSpec", "CRabbitMQ",
                                                    .product(name: "Logging", package: "swift-log")]),
        .target(name: "AttuneWorker", dependencies: ["AttuneSpec", "AttuneTraining", "AttuneStore", "AttuneQueue",
                                                     .product(name: "Logging", package: "swift-log")]),
        .executableTarget(name: "attune", dependencies: [
            "AttuneSpec", "AttuneTraining", "AttuneStore", "AttuneQueue", "AttuneWorker",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Logging", package: "swift-log"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
        ]),

        .testTarget(name: "AttuneSpecTests", dependencies: ["AttuneSpec"]),
        .testTarget(name: "AttuneTrainingTests", dependencies: ["AttuneTraining", "AttuneSpec"]),
        .testTarget(name: "AttuneStoreTests", dependencies: ["AttuneStore", "AttuneSpec"]),
        .testTarget(name: "AttuneQueueTests", dependencies: ["AttuneQueue", "AttuneSpec"]),
        .testTarget(name: "AttuneWorkerTests", dependencies: ["AttuneWorker", "AttuneTraining", "AttuneStore",
                                                              "AttuneQueue", "AttuneSpec"]),
    ],
    swiftLanguageModes: [.v5]
)

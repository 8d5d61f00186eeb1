// swift-tools-version:6.0
import PackageDescription

// The kernels are optimized in debug builds too: unoptimized SIMD code runs a hundred times slower, which
// would stretch every test that trains. On x86-64 they are built for x86-64-v3 (AVX2, FMA).
var kernelSettings: [SwiftSetting] = [.unsafeFlags(["-O"], .when(configuration: .debug))]
#if arch(x86_64)
kernelSettings.append(.unsafeFlags(["-target-cpu", "haswell"]))
#endif

// The integration test targets (servers, Python, a browser) are part of the package only with
// ATTUNE_INTEGRATION_TESTS=1, as scripts/test.sh sets it: a plain `swift test` builds and runs the unit tests
// and needs nothing but the toolchain and the C libraries.
let integrationTests = Context.environment["ATTUNE_INTEGRATION_TESTS"] == "1"

// The compiler checks what each file imports and how it uses existentials: every import declared where it is
// used, internal unless the module's public API shows the imported types, and `any` spelled out.
let strictSettings: [SwiftSetting] = [.enableUpcomingFeature("ExistentialAny"),
                                      .enableUpcomingFeature("MemberImportVisibility"),
                                      .enableUpcomingFeature("InternalImportsByDefault")]
// Every Swift target but the C ones (CPUFeatures, CDenseKernels) and the system libraries.
let looseTargets: Set<String> = ["CPUFeatures", "CDenseKernels"]

let package = Package(
    name: "Attune",
    // macOS 15: the `Synchronization` module (Atomic, Mutex) of the training threads.
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "attune", targets: ["attune"]),
        // For the fuzz package in Fuzz/, which depends on this one by path.
        .library(name: "AttuneJobs", targets: ["AttuneSpec", "AttuneTraining", "AttuneCodecs"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-protobuf", from: "1.39.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        // jwt-kit 5 needs swift-crypto 4.
        .package(url: "https://github.com/apple/swift-crypto", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird-auth", from: "2.5.0"),
        .package(url: "https://github.com/vapor/jwt-kit", from: "5.7.1"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.2"),
    ],
    targets: [
        .systemLibrary(name: "CRabbitMQ", pkgConfig: "librabbitmq",
                       providers: [.apt(["librabbitmq-dev"])]),
        .systemLibrary(name: "CLibPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .systemLibrary(name: "CBLAS", providers: [.apt(["libblas-dev"])]),
        .systemLibrary(name: "CPNG", pkgConfig: "libpng16", providers: [.apt(["libpng-dev"])]),
        .systemLibrary(name: "CTurboJPEG", pkgConfig: "libturbojpeg", providers: [.apt(["libturbojpeg0-dev"])]),

        // The commit this build is made from, for AttuneRelease (`attune --version`): written at every build by
        // the prebuild plugin AttuneBuildCommit (its file says why not here, from Context.gitInformation). Under
        // Sources/ because the image build copies that folder.
        .plugin(name: "AttuneBuildCommit", capability: .buildTool(), path: "Sources/AttuneBuildCommit"),
        .target(name: "AttuneBuildInfo", plugins: ["AttuneBuildCommit"]),
        .target(name: "AttuneSpec",
                dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneBuildInfo"]),
        .target(name: "AttuneImage", dependencies: ["AttuneSpec", "CPNG", "CTurboJPEG"]),
        // The small layers' products (SmallProducts), built for x86-64-v3 (AVX2 and FMA) on x86-64 and run
        // only where CPUFeatures says the processor has them. CPUFeatures also asks BLIS, in a child process,
        // which configuration it would pick (TrainingKernels).
        .target(name: "CPUFeatures", linkerSettings: [.linkedLibrary("blis")]),
        .target(name: "AttuneKernels", dependencies: ["CPUFeatures"], swiftSettings: kernelSettings),
        // The split first layer's forward product and weight gradient on AVX-512 processors (dense_kernels.c
        // says why). Its functions carry their own target attributes; -O2 also in debug builds, where tests run it.
        .target(name: "CDenseKernels", cSettings: [.unsafeFlags(["-O2"])]),
        .target(name: "AttuneTraining", dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneSpec", "AttuneImage", "AttuneKernels", "CBLAS", "CDenseKernels",
                                                       "CPUFeatures", "AttunePrivacy"]),
        .target(name: "AttuneStore", dependencies: ["AttuneSpec", "CLibPQ",
                                                    .product(name: "Crypto", package: "swift-crypto"),
                                                    .product(name: "Logging", package: "swift-log")]),
        // What travels on the broker, encoded and decoded, without the AMQP client: the fuzzer links this alone.
        .target(name: "AttuneCodecs", dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneSpec", .product(name: "Crypto", package: "swift-crypto")]),
        .target(name: "AttuneQueue", dependencies: ["AttuneSpec", "AttuneCodecs", "CRabbitMQ",
                                                    .product(name: "Crypto", package: "swift-crypto"),
                                                    .product(name: "Logging", package: "swift-log")]),
        .target(name: "AttuneWorker", dependencies: [.product(name: "CoreMetrics", package: "swift-metrics"), .product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneCodecs", "AttuneSpec", "AttuneTraining", "AttuneStore", "AttuneQueue",
                                                     .product(name: "Logging", package: "swift-log"),
                                                     .product(name: "Metrics", package: "swift-metrics")]),
        // `attune doctor`'s checks: facts from both servers and the training runtime, judged by pure functions.
        .target(name: "AttuneDoctor", dependencies: ["AttuneSpec", "AttuneStore", "AttuneQueue", "AttuneTraining"]),
        // The worker's HTTP side (metrics, health): Hummingbird and swift-prometheus stay out of the worker.
        .target(name: "AttuneHTTP", dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), .product(name: "NIOFoundationEssentialsCompat", package: "swift-nio"), "AttuneCodecs", "AttuneQueue", .product(name: "HummingbirdCore", package: "hummingbird"), "AttuneSpec", "AttuneStore", "AttuneTraining",
                                                   .product(name: "Hummingbird", package: "hummingbird"),
                                                   .product(name: "HummingbirdAuth", package: "hummingbird-auth"),
                                                   .product(name: "JWTKit", package: "jwt-kit"),
                                                   .product(name: "HTTPTypes", package: "swift-http-types"),
                                                   .product(name: "NIOCore", package: "swift-nio"),
                                                   .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                                                   .product(name: "HummingbirdBcrypt", package: "hummingbird-auth"),
                                                   .product(name: "Crypto", package: "swift-crypto"),
                                                   .product(name: "Metrics", package: "swift-metrics"),
                                                   .product(name: "Prometheus", package: "swift-prometheus"),
                                                   .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                                                   // FleetWatch reads each worker's /metrics.
                                                   .product(name: "AsyncHTTPClient", package: "async-http-client"),
                                                   .product(name: "NIOHTTP1", package: "swift-nio"),
                                                   .product(name: "Logging", package: "swift-log")]),
        // Issue 52's private averaging and its accountant: pure computation on Foundation alone, so the
        // privacy arithmetic is reviewed and tested without a server.
        .target(name: "AttunePrivacy"),
        // Benchmarks/training.sh's Swift side: built alone in release, without the server modules.
        .target(name: "BenchProbes", path: "Benchmarks/BenchProbes"),
        .executableTarget(name: "attune-training-bench", dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneSpec", "AttuneTraining", "BenchProbes"],
                          path: "Benchmarks/TrainingBench"),
        .executableTarget(name: "attune", dependencies: [.product(name: "UnixSignals", package: "swift-service-lifecycle"), "AttuneCodecs", .product(name: "SwiftProtobuf", package: "swift-protobuf"), 
            "AttuneSpec", "AttuneTraining", "AttuneStore", "AttuneQueue", "AttuneWorker", "AttuneImage", "AttuneHTTP",
            "AttuneDoctor", "AttunePrivacy",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Logging", package: "swift-log"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
        ]),

        // Unit tests: nothing but the code under test (a plain `swift test` on a fresh machine runs these).
        .testTarget(name: "AttuneSpecTests", dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneSpec"]),
        // The store's pure parts (envelopes, keys, error classification, release bookkeeping): no server.
        .testTarget(name: "AttuneStoreTests", dependencies: ["AttuneStore", "AttuneSpec",
                                                            .product(name: "Crypto", package: "swift-crypto")]),
        .testTarget(name: "AttuneTrainingTests", dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneTraining", "AttuneKernels", "CDenseKernels", "AttuneImage", "AttuneSpec",
                                                                "TrainingTestSupport"]),
        .testTarget(name: "AttuneImageTests", dependencies: ["AttuneImage", "AttuneSpec"]),
        .testTarget(name: "AttuneQueueTests", dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneQueue", "AttuneCodecs", "AttuneSpec", "QueueTestSupport"]),
        // Server-free tests of the delivery server's decisions: tokens, the event loop's answers, operators, and both
        // listeners' routes in process (HummingbirdTesting).
        .testTarget(name: "AttuneHTTPTests", dependencies: ["AttuneHTTP", "AttuneStore",
                                                           .product(name: "Crypto", package: "swift-crypto"),
                                                           .product(name: "HTTPTypes", package: "swift-http-types"),
                                                           .product(name: "NIOCore", package: "swift-nio"),
                                                           .product(name: "NIOEmbedded", package: "swift-nio"),
                                                           .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                                                           .product(name: "HummingbirdTesting", package: "hummingbird"),
                                                           .product(name: "Hummingbird", package: "hummingbird"),
                                                           .product(name: "Prometheus", package: "swift-prometheus"),
                                                           .product(name: "Logging", package: "swift-log")]),
        // attune doctor's judgements, from the facts that make each fail.
        .testTarget(name: "AttuneDoctorTests", dependencies: ["AttuneDoctor", "AttuneQueue", "AttuneSpec"]),
        // The accountant against published values, and the averaging's clipping, noise and sampling.
        .testTarget(name: "AttunePrivacyTests", dependencies: ["AttunePrivacy"]),
        // The worker's decisions against in-memory fakes of its store.
        .testTarget(name: "AttuneWorkerTests", dependencies: ["AttuneCodecs", "AttuneQueue", .product(name: "Logging", package: "swift-log"), "AttuneWorker", "AttuneTraining", "AttuneStore", "AttuneSpec",
                                                              "WorkerTestSupport"]),
        // Helpers the unit and integration tests of one module share.
        .target(name: "TrainingTestSupport", dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneTraining", "AttuneSpec"], path: "Tests/Support/TrainingTestSupport"),
        .target(name: "QueueTestSupport", dependencies: ["AttuneSpec"], path: "Tests/Support/QueueTestSupport"),
        .target(name: "WorkerTestSupport", dependencies: ["AttuneSpec"], path: "Tests/Support/WorkerTestSupport"),
    ] + (integrationTests ? [
        // Integration tests: real PostgreSQL and RabbitMQ, Python with NumPy and coremltools, a browser.
        .testTarget(name: "AttuneTrainingIntegrationTests", dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneTraining", "AttuneKernels", "AttuneImage",
                                                                           "AttuneSpec", "TrainingTestSupport"]),
        .testTarget(name: "AttuneImageIntegrationTests", dependencies: ["AttuneImage", "AttuneSpec"]),
        .testTarget(name: "AttuneQueueIntegrationTests", dependencies: ["AttuneQueue", "AttuneCodecs", "AttuneSpec", "QueueTestSupport"]),
        .testTarget(name: "AttuneStoreIntegrationTests", dependencies: ["AttuneStore", "AttuneSpec",
                                                                        .product(name: "Crypto", package: "swift-crypto")]),
        .testTarget(name: "AttuneWorkerIntegrationTests", dependencies: ["AttuneCodecs", .product(name: "SwiftProtobuf", package: "swift-protobuf"), "AttuneWorker", "AttuneTraining", "AttuneStore",
                                                                         "AttunePrivacy", "AttuneQueue", "AttuneSpec", "WorkerTestSupport",
                                                                         .product(name: "Crypto", package: "swift-crypto"),
                                                                         .product(name: "Logging", package: "swift-log")]),
    ] : []),
    swiftLanguageModes: [.v6]
)

for target in package.targets where target.type != .system && target.type != .plugin && !looseTargets.contains(target.name) {
    target.swiftSettings = (target.swiftSettings ?? []) + strictSettings
}

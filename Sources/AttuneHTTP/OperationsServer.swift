import AttuneStore
import Foundation
public import Hummingbird
public import Logging
import Metrics
public import Prometheus

/// A worker's HTTP port for its operators: `/metrics` in Prometheus' text format, `/healthz` (the process
/// answers) and `/readyz` (it can work: the broker connection is open and PostgreSQL answers).
public enum OperationsServer {
    /// Makes swift-metrics report to a Prometheus registry; call once, before the worker is made.
    public static func bootstrapMetrics() -> PrometheusCollectorRegistry {
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        // Jobs take from a millisecond (a small task) to minutes (a big one).
        factory.defaultDurationHistogramBuckets = [
            .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25),
            .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1),
            .seconds(2.5), .seconds(5), .seconds(10), .seconds(30), .seconds(60), .seconds(300),
        ]
        MetricsSystem.bootstrap(factory)
        return registry
    }

    /// The HTTP application, a service for the command's service group.
    /// - Parameter brokerConnected: whether the worker's broker connection is open now (its readiness).
    public static func application(host: String, port: Int, registry: PrometheusCollectorRegistry,
                                   brokerConnected: @escaping @Sendable () -> Bool,
                                   databaseURL: String, logger: Logger) -> some ApplicationProtocol {
        let router = Router()
        router.get("metrics") { _, _ -> Response in
            var buffer = [UInt8]()
            registry.emit(into: &buffer)
            return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                            body: .init(byteBuffer: ByteBuffer(bytes: buffer)))
        }
        router.get("healthz") { _, _ in "ok\n" }
        router.get("readyz") { _, _ -> Response in
            let problems = await readiness(brokerConnected: brokerConnected(), databaseURL: databaseURL)
            let text = problems.isEmpty ? "ready\n" : problems.map { "not ready: \($0)\n" }.joined()
            return Response(status: problems.isEmpty ? .ok : .serviceUnavailable,
                            headers: [.contentType: "text/plain; charset=utf-8"],
                            body: .init(byteBuffer: ByteBuffer(string: text)))
        }
        return Application(router: router, configuration: .init(address: .hostname(host, port: port)),
                           onServerRunning: { channel in
                               let bound = channel.localAddress
                               logger.info("serving /metrics, /healthz and /readyz on http://\(bound?.ipAddress ?? host):\(bound?.port ?? port)")
                           }, logger: logger)
    }

    /// What keeps the worker from working, in words; empty when it can.
    static func readiness(brokerConnected: Bool, databaseURL: String) async -> [String] {
        var problems: [String] = []
        if !brokerConnected { problems.append("no connection to RabbitMQ") }
        if let database = await databaseProblem(databaseURL) { problems.append(database) }
        return problems
    }

    /// Why PostgreSQL does not answer on a fresh connection within 2 s, in its public words; nil when it does.
    /// The probe's port is the operators' (never the device port), and a probe comes every few seconds.
    static func databaseProblem(_ databaseURL: String) async -> String? {
        // Not `try?`: the probe's nil (no problem) must not read as a refused probe.
        do {
            return try await probes.run { _ in ServerFacts.databaseProblem(url: databaseURL) }
        } catch {
            return "PostgreSQL's probe is still running"
        }
    }

    /// libpq blocks: probes run on one thread of their own, one at a time.
    static let probes = BlockingPool<Void>(name: "probes", limits: .init(size: 1, wait: .seconds(5)), open: {})
}

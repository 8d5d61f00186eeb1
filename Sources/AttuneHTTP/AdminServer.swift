import Foundation
public import Hummingbird
import HummingbirdAuth
public import Logging
public import Prometheus

/// `attune serve`'s admin listener: the operators' dashboard and its APIs (`/`, `/dashboard/*`, `/api/*`)
/// and the device port's Prometheus metrics (`/metrics`, scraped with the operator's basic auth),
/// on an address of its own (loopback unless told otherwise) and only for an operator of the operators file
/// (HTTP basic auth). Nothing here is routed on the device port.
public enum AdminServer {
    /// - Parameter producers: who may read job outcomes (`/api/jobs/*`) and nothing else here; nil: operators only.
    public static func application(host: String, port: Int, operators: OperatorCredentials,
                                   producers: OperatorCredentials? = nil, delivery: ModelDelivery,
                                   amqpURL: String, chartJS: String, metrics: PrometheusCollectorRegistry,
                                   workerMetricsPorts: [Int] = [9464], logger: Logger) -> some ApplicationProtocol {
        let router = Router()
        router.add(middleware: HardeningMiddleware(headers: HTTPHardening.adminHeaders, logger: logger,
                                                   bodies: [JobOutcomesAPI.lookupPath: JobOutcomesAPI.lookupBodyLimit]
                                                    .merging(DashboardActions.bodyLimits) { $1 }))
        router.add(middleware: OperatorMiddleware(operators: operators, producers: producers))
        let hub = EventHub(amqpURL: amqpURL, logger: logger)
        hub.start()
        let fleet = FleetWatch(delivery: delivery, amqpURL: amqpURL,
                               configuration: .init(workerMetricsPorts: workerMetricsPorts), logger: logger)
        Dashboard.add(to: router, hub: hub, delivery: delivery, amqpURL: amqpURL, chartJS: chartJS, fleet: fleet, logger: logger)
        DashboardActions.add(to: router, delivery: delivery, amqpURL: amqpURL, fleet: fleet, logger: logger)
        JobOutcomesAPI.add(to: router, delivery: delivery)
        router.get("metrics") { _, _ -> Response in
            var buffer = [UInt8]()
            metrics.emit(into: &buffer)
            return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                            body: .init(byteBuffer: ByteBuffer(bytes: buffer)))
        }
        return Application(router: router, server: HTTPHardening.server(idle: .seconds(60)),
                           configuration: .init(address: .hostname(host, port: port), serverName: nil),
                           onServerRunning: { channel in
                               let bound = channel.localAddress
                               logger.info("serving the operators' dashboard on http://\(bound?.ipAddress ?? host):\(bound?.port ?? port)")
                           }, logger: logger)
    }
}

/// 401 with a basic-auth challenge unless the request carries an operator's name and password, or, for the
/// job outcomes (`/api/jobs/*`) only, a producer's; 403 for a producer anywhere else.
struct OperatorMiddleware<Context: RequestContext>: RouterMiddleware {
    let operators: OperatorCredentials
    var producers: OperatorCredentials? = nil

    /// The paths a producer's credential opens.
    static func isProducerPath(_ path: String) -> Bool { path.hasPrefix("/api/jobs/") }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        if let basic = request.headers.basic {
            let operators = self.operators, producers = self.producers
            let (name, password) = (basic.username, basic.password)
            // bcrypt takes tens of milliseconds: off the event loop, on a few threads however many log in.
            let caller: Caller = (try? await PasswordChecks.pool.run { _ in
                if operators.verify(name: name, password: password) { return Caller.operator }
                return producers?.verify(name: name, password: password) == true ? .producer : .nobody
            }) ?? .nobody
            switch caller {
            case .operator:
                return try await next(request, context)
            case .producer where Self.isProducerPath(request.uri.path):
                return try await next(request, context)
            case .producer:
                return Response(status: .forbidden, headers: [.contentType: "text/plain; charset=utf-8"],
                                body: .init(byteBuffer: ByteBuffer(string: "a producer's credential reads job outcomes (/api/jobs/*) only\n")))
            case .nobody:
                break
            }
        }
        return Response(status: .unauthorized,
                        headers: [.wwwAuthenticate: "Basic realm=\"attune operators\", charset=\"UTF-8\"",
                                  .contentType: "text/plain; charset=utf-8"],
                        body: .init(byteBuffer: ByteBuffer(string: "an operator's name and password are required\n")))
    }

    private enum Caller { case `operator`, producer, nobody }
}

/// bcrypt's threads: two, however many log in at once (a guessing client waits its turn rather than starting threads).
enum PasswordChecks {
    static let pool = BlockingPool<Void>(name: "passwords", limits: .init(size: 2, wait: .seconds(5)), open: {})
}

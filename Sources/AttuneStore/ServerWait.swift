public import Foundation

/// Waiting for a PostgreSQL that is not accepting connections yet. A one-shot command started beside its
/// server (compose's `migrate`, a Kubernetes Job) can run while the server is still starting: the official
/// image's first start runs a server on its socket alone, for the init scripts, and then restarts it, so a
/// health check can pass before the server takes TCP connections. Such a command waits out the outage; a
/// refusal that names a deployment mistake (a wrong password, no such database) is reported at once, since
/// waiting cannot fix it.
public struct ServerWait: Sendable {
    /// How long to keep trying after the first refusal; 0 tries once.
    public var seconds: Double

    public init(seconds: Double) {
        self.seconds = seconds
    }

    /// Runs `attempt` until it succeeds, throws something other than a transient `DatabaseError`, or `seconds`
    /// have passed since the first try (then the last error is thrown). `waiting` hears the first refusal only,
    /// so a log says once what is awaited. `sleep` and `now` are parameters so the policy can be checked alone.
    public func run<T>(_ attempt: () throws -> T,
                       waiting: (DatabaseError) -> Void = { _ in },
                       now: () -> Double = { ProcessInfo.processInfo.systemUptime },
                       sleep: (Double) -> Void = { Thread.sleep(forTimeInterval: $0) }) throws -> T {
        let deadline = now() + max(0, seconds)
        // A quarter of a second first: a server restarting after its init is back within a second or two.
        var pauses = Backoff(initial: 0.25, maximum: 2)
        var told = false
        while true {
            do {
                return try attempt()
            } catch let error as DatabaseError where error.kind == .connection {
                let left = deadline - now()
                guard left > 0 else { throw error }
                if !told {
                    waiting(error)
                    told = true
                }
                sleep(min(pauses.next(), left))
            }
        }
    }
}

extension PostgresConnection {
    /// Connects, waiting up to `wait.seconds` for a server that does not accept connections yet.
    public static func connect(url: String, wait: ServerWait,
                               waiting: (DatabaseError) -> Void = { _ in }) throws -> PostgresConnection {
        try wait.run({ try PostgresConnection(url: url) }, waiting: waiting)
    }
}

import Synchronization
import Foundation
import Metrics

/// What the device port answered, for the admin listener's `/metrics`: requests by route, status and
/// whether the event loop answered them from memory (`DevicePortHandler`) or the router did. Routes are
/// named by kind, never by model or user, so the series stay few.
final class DeliveryMetrics: Sendable {
    static let shared = DeliveryMetrics()
    private let counters = Mutex<[String: Counter]>([:])

    enum Route: String {
        case personal, base, collection, health, other
    }

    static func route(ofPath path: String) -> Route {
        let parts = path.split(separator: "?", maxSplits: 1).first?.split(separator: "/") ?? []
        switch (parts.count, parts.first, parts.dropFirst().first) {
        case (5, "v1", "models"): return .personal
        case (3, "v1", "models"): return .base
        case (3, "v1", "collections"), (5, "v1", "collections"): return .collection
        case (1, "healthz", _), (1, "readyz", _): return .health
        default: return .other
        }
    }

    func count(_ route: Route, status: Int, fromMemory: Bool) {
        let key = "\(route.rawValue) \(status) \(fromMemory)"
        let counter = counters.withLock { counters in
            if let counter = counters[key] { return counter }
            let counter = Counter(label: "attune_delivery_requests_total",
                                  dimensions: [("route", route.rawValue), ("status", "\(status)"),
                                               ("answered_by", fromMemory ? "event_loop" : "router")])
            counters[key] = counter
            return counter
        }
        counter.increment()
    }
}

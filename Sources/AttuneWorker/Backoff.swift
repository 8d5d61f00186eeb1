import Foundation

/// Reconnection delays: `initial` doubling up to `maximum`, reset once a connection is made again.
struct Backoff {
    private let initial: TimeInterval
    private let maximum: TimeInterval
    private var current: TimeInterval

    init(initial: TimeInterval = 0.5, maximum: TimeInterval = 30) {
        self.initial = initial
        self.maximum = maximum
        self.current = initial
    }

    mutating func next() -> TimeInterval {
        defer { current = min(current * 2, maximum) }
        return current
    }

    mutating func reset() { current = initial }
}

public import Foundation

/// Reconnection delays: `initial` doubling up to `maximum`, reset once a connection is made again.
/// Shared by the worker's reconnects and `ServerWait`.
public struct Backoff: Sendable {
    private let initial: TimeInterval
    private let maximum: TimeInterval
    private var current: TimeInterval

    public init(initial: TimeInterval = 0.5, maximum: TimeInterval = 30) {
        self.initial = initial
        self.maximum = maximum
        self.current = initial
    }

    public mutating func next() -> TimeInterval {
        defer { current = min(current * 2, maximum) }
        return current
    }

    public mutating func reset() { current = initial }
}

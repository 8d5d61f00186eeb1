import AttuneCodecs
import Foundation

/// Attune's conventions on top of the AMQP client: the private queues a monitor or a worker binds to one of
/// Attune's exchanges, and the plain bound queue tests and tools declare. The client itself
/// (`AMQPConnection.swift`) knows frames, channels, confirms and consumers, not Attune's exchanges; the job
/// topology with its dead-letter and retry queues is `JobQueues`.
extension AMQPConnection {
    /// Declares a server-named, exclusive, auto-delete queue bound to `attune.events` with each of
    /// `bindingKeys` (see `EventRouting.bindingKey`) and returns its name; then `consume(queue:)` it.
    /// The queue disappears with this connection.
    public func declareEventQueue(bindingKeys: [String]) throws -> String {
        try declarePrivateQueue(boundTo: Topology.eventsExchange, keys: bindingKeys)
    }

    /// Declares a server-named, exclusive, auto-delete queue bound to `exchange` with each of `keys` and
    /// returns its name. The queue disappears with this connection.
    public func declarePrivateQueue(boundTo exchange: String, keys: [String]) throws -> String {
        let name = try declareExclusiveQueue(operation: "declare a queue of this connection's own on \(exchange)")
        for key in keys { try bind(queue: name, exchange: exchange, key: key) }
        return name
    }

    /// Declares a plain durable queue bound to `exchange` with `key`: for tests and tools that want
    /// their own view of an exchange. Attune's own queues come from `JobQueues.declare()`.
    public func declareQueue(_ name: String, boundTo exchange: String, key: String) throws {
        try declareQueue(name, arguments: [])
        try bind(queue: name, exchange: exchange, key: key)
    }
}

extension AMQPConnection {
    /// Declares the durable queue `name` bound to `attune.events` with the terminal kinds' keys (`completed`,
    /// `failed`, `cancelled`, `held`) of `model` and `user` (nil: every one): the queue a producer consumes
    /// from to hear every job's end even across its own restarts. A quorum queue, so that on a cluster it
    /// outlives a node. Redeclaring it is harmless; binding more keys to it adds them.
    public func declareTerminalEventQueue(_ name: String, model: String?, user: String?) throws {
        try declareQueue(name, arguments: [("x-queue-type", .string("quorum"))])
        for key in EventRouting.bindingKeys(model: model, user: user, kinds: EventRouting.terminalKinds) {
            try bind(queue: name, exchange: Topology.eventsExchange, key: key)
        }
    }
}

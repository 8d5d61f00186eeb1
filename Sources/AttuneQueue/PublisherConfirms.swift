/// The publisher-confirm bookkeeping of one channel: which published messages the broker has not confirmed
/// yet, the confirms (basic.ack, basic.nack) that arrived and were not taken yet, and the mandatory messages
/// it returned. Pure bookkeeping: `AMQPConnection` feeds it the frames and hands its answers out.
struct PublisherConfirms {
    /// Whether the channel is in confirm mode (confirm.select was answered).
    private(set) var enabled = false
    /// Sequence number of the last message published since confirm.select.
    private var sequence: UInt64 = 0
    /// Published messages the broker has not confirmed yet, in sequence order.
    private var unconfirmed: [UInt64] = []
    /// Confirms received and not yet taken by `take()` or a waiting publish.
    private var confirms: [UInt64: Bool] = [:]
    /// The last basic.return since `clearLastReturn()`.
    private var lastReturn: (code: Int, text: String, messageId: String?)?
    /// Message ids of mandatory messages the broker returned since the last `takeReturnedMessageIds()`.
    private var returnedMessageIds: [String] = []

    /// confirm.select was answered: numbering starts again.
    mutating func enable() {
        enabled = true
        sequence = 0
        unconfirmed = []
        confirms = [:]
    }

    /// A message went out in confirm mode; returns its sequence number.
    mutating func published() -> UInt64 {
        sequence += 1
        unconfirmed.append(sequence)
        return sequence
    }

    var unconfirmedCount: Int { unconfirmed.count }

    /// Records a basic.ack or basic.nack, which may cover every earlier message too.
    mutating func resolve(_ tag: UInt64, multiple: Bool, acked: Bool) {
        if multiple {
            let covered = unconfirmed.prefix { $0 <= tag }
            for sequence in covered { confirms[sequence] = acked }
            unconfirmed.removeFirst(covered.count)
        } else if let index = unconfirmed.firstIndex(of: tag) {
            unconfirmed.remove(at: index)
            confirms[tag] = acked
        }
    }

    /// Whether `sequence`'s confirm has arrived and was not taken yet.
    func hasArrived(_ sequence: UInt64) -> Bool { confirms[sequence] != nil }

    /// Takes `sequence`'s confirm: true for an ack, false for a nack, nil if none arrived.
    mutating func take(_ sequence: UInt64) -> Bool? { confirms.removeValue(forKey: sequence) }

    /// Confirms that arrived since the last call: sequence number → true (ack) or false (nack).
    mutating func takeAll() -> [UInt64: Bool] {
        defer { confirms.removeAll(keepingCapacity: true) }
        return confirms
    }

    /// Records a basic.return.
    mutating func returned(code: Int, text: String, messageId: String?) {
        lastReturn = (code, text, messageId)
        if let messageId { returnedMessageIds.append(messageId) }
    }

    mutating func clearLastReturn() { lastReturn = nil }

    /// The last return, taken: it belonged to the one message a waiting publish had in flight, so its message
    /// id is no longer reported by `takeReturnedMessageIds()`.
    mutating func takeLastReturn() -> (code: Int, text: String, messageId: String?)? {
        guard let returned = lastReturn else { return nil }
        lastReturn = nil
        returnedMessageIds.removeAll { $0 == returned.messageId }
        return returned
    }

    mutating func takeReturnedMessageIds() -> [String] {
        defer { returnedMessageIds.removeAll() }
        return returnedMessageIds
    }
}

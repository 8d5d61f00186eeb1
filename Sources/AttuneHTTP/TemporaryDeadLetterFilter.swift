import AttuneQueue
// Stand-in until DeadLetterQueue grows its filter; deleted then.
struct DeadLetterFilter: Sendable {
    var jobIds: Set<String>?
    var user: String?
    var model: String?
    var reasonContains: String?
}
extension DeadLetterQueue {
    func replay(matching filter: DeadLetterFilter) throws -> [DeadLetter] {
        try (filter.jobIds.map { $0.map { Optional($0) } } ?? [nil]).flatMap { try replay(jobId: $0) }
    }
    func purge(matching filter: DeadLetterFilter) throws -> [DeadLetter] {
        try Array(filter.jobIds ?? []).flatMap { id in try purge(jobId: id) > 0 ? [DeadLetter(jobId: id, userId: "", reason: "")] : [] }
    }
}

import AttuneSpec

/// How the worker's log names the jobs a line is about, so an operator can tell which jobs failed,
/// waited or were given up. A job is named by its job id; one whose id is unknown or not a valid id (a body
/// no one could read, sent without a message id) by its delivery tag, so that no text a producer chose is
/// printed raw (it could forge log lines). A batch is named by its size and its first few ids.
enum JobNames {
    /// How many ids a line about a batch spells out.
    static let shown = 5

    /// `jobID` when it is a valid id, else the delivery (`delivery 17`).
    static func name(_ jobID: String, delivery tag: UInt64) -> String {
        Identifier.isValid(jobID) ? jobID : "delivery \(tag)"
    }

    /// `job a`, `3 jobs (a, b, c)`, `40 jobs (a, b, c, d, e and 35 more)`.
    static func list(_ names: [String]) -> String {
        switch names.count {
        case 0: return "a job"
        case 1: return "job \(names[0])"
        case ...shown: return "\(names.count) jobs (\(names.joined(separator: ", ")))"
        default:
            return "\(names.count) jobs (\(names.prefix(shown).joined(separator: ", ")) and \(names.count - shown) more)"
        }
    }
}

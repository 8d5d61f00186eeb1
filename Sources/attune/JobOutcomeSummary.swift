import AttuneStore
import Foundation

/// How `attune job show` prints an outcome for a person; the JSON form is `JobOutcomeRecord.json` (AttuneHTTP).
extension JobOutcomeRecord {
    /// One line for a person: the state and what matters in it.
    var summary: String {
        let line = [model, user].compactMap { $0 }.joined(separator: "/")
        let who = line.isEmpty ? "" : " \(line)"
        switch state {
        case .unknown: return "\(jobId): unknown (no worker has settled it yet: still queued, or never published)"
        case .completed, .held:
            var text = "\(jobId): \(state.rawValue)\(who) v\(version ?? 0)"
            if let loss { text += String(format: ", loss %.4g", loss) }
            if let samples { text += ", \(samples) samples" }
            if let validationAccuracy { text += String(format: ", validation accuracy %.3f", validationAccuracy) }
            if duplicates > 0 { text += ", \(duplicates) duplicate deliver\(duplicates == 1 ? "y" : "ies") acked untrained" }
            if state == .held, let reason { text += "; held back from devices: \(reason)" }
            return text
        case .failed:
            return "\(jobId): failed\(who) after \(attempts) transient attempt(s), dead-lettered: \(reason ?? "")"
        case .retrying:
            return "\(jobId): retrying\(who), \(attempts) attempt(s) failed so far: \(reason ?? "")"
        case .cancelled:
            return "\(jobId): cancelled\(who) (\(cancelStage ?? "queued"))\(reason.map { $0.isEmpty ? "" : ": \($0)" } ?? "")"
        case .forgotten:
            return "\(jobId): forgotten (its user was erased with attune user forget)"
        }
    }
}

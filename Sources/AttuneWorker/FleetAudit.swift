public import AttuneQueue
public import AttuneSpec
public import AttuneStore
import AttuneTraining
import Foundation
import SwiftProtobuf

/// What the fault suite asserts after a run, read from PostgreSQL, the dead-letter queue and the copy
/// of every published job: each job ended exactly once (as one version or as a dead letter), nothing
/// else was committed, every user's line equals a sequential replay of its jobs, and no large object
/// is left without an owner.
public struct AuditReport: Sendable {
    public var published = 0
    public var versions = 0
    /// Distinct job ids in the dead-letter queue, and how many messages carry them.
    public var deadLettered = 0
    public var deadLetterMessages = 0
    public var inBoth: [String] = []
    public var lost: [String] = []
    public var versionsWithoutJob: [String] = []
    public var deadLettersWithoutJob: [String] = []
    public var usersReplayed = 0
    public var versionsReplayed = 0
    public var replayMismatches: [String] = []
    public var orphanedLargeObjects = 0
    public var deadLetterReasons: [String: Int] = [:]

    public var violations: [String] {
        var found: [String] = []
        if !inBoth.isEmpty { found.append("\(inBoth.count) job(s) both committed and dead-lettered: \(inBoth.prefix(5))") }
        if !lost.isEmpty { found.append("\(lost.count) job(s) neither committed nor dead-lettered: \(lost.prefix(5))") }
        if !versionsWithoutJob.isEmpty {
            found.append("\(versionsWithoutJob.count) version(s) for job ids never published: \(versionsWithoutJob.prefix(5))")
        }
        if !deadLettersWithoutJob.isEmpty {
            found.append("\(deadLettersWithoutJob.count) dead letter(s) for job ids never published: \(deadLettersWithoutJob.prefix(5))")
        }
        found += replayMismatches
        if orphanedLargeObjects > 0 { found.append("\(orphanedLargeObjects) orphaned large object(s)") }
        return found
    }

    /// Lines for people; the fault suite greps `lost` and `violations` from them.
    public var lines: [String] {
        var out = [
            "published            \(published)",
            "versions             \(versions)",
            "dead-lettered        \(deadLettered) (\(deadLetterMessages) message(s))",
            "in both              \(inBoth.count)",
            "lost                 \(lost.count)",
            "versions w/o job     \(versionsWithoutJob.count)",
            "users replayed       \(usersReplayed) (\(versionsReplayed) versions, bit-identical: \(replayMismatches.isEmpty ? "yes" : "NO"))",
            "orphaned LOs         \(orphanedLargeObjects)",
        ]
        for (reason, count) in deadLetterReasons.sorted(by: { $0.value > $1.value }) {
            out.append("  dead letter x\(count): \(reason.prefix(160))")
        }
        out.append("violations           \(violations.count)")
        out += violations.map { "  VIOLATION: \($0)" }
        return out
    }
}

public struct FleetAudit {
    private let registry: ModelRegistry
    private let model: String

    public init(registry: ModelRegistry, model: String) {
        self.registry = registry
        self.model = model
    }

    /// Every committed version of the model with its job, by user in version order.
    public func committedJobs() throws -> [CommittedVersion] {
        try registry.committedVersions(model: model)
    }

    public func check(jobs: [Attune_V1_TrainingJob], deadLetters: [DeadLetter]) throws -> AuditReport {
        var report = AuditReport()
        let byID = Dictionary(jobs.map { ($0.jobID, $0) }, uniquingKeysWith: { first, _ in first })
        let published = Set(byID.keys)
        let committed = try committedJobs()
        let committedIDs = Set(committed.map(\.jobID))
        let deadIDs = Set(deadLetters.map(\.jobId))
        report.published = published.count
        report.versions = committed.count
        report.deadLettered = deadIDs.count
        report.deadLetterMessages = deadLetters.count
        for letter in deadLetters { report.deadLetterReasons[Self.reasonKind(letter.reason), default: 0] += 1 }
        report.inBoth = committedIDs.intersection(deadIDs).sorted()
        report.lost = published.subtracting(committedIDs).subtracting(deadIDs).sorted()
        report.versionsWithoutJob = committedIDs.subtracting(published).sorted()
        report.deadLettersWithoutJob = deadIDs.subtracting(published).sorted()
        report.orphanedLargeObjects = try orphanedLargeObjects()

        let lines = Dictionary(grouping: committed, by: \.user)
        for (user, line) in lines.sorted(by: { $0.key < $1.key }) {
            report.usersReplayed += 1
            if let mismatch = try replay(user: user, versions: line.map { ($0.version, $0.jobID) }, jobs: byID,
                                         replayed: &report.versionsReplayed) {
                report.replayMismatches.append(mismatch)
            }
        }
        return report
    }

    /// Retrains a user's jobs one after another from the base, as one worker would have with no faults,
    /// and compares every stored version with the replay. Training is deterministic (fixed seeds, one
    /// summation order), so the comparison is exact: any difference means a version was trained from
    /// the wrong parent, twice, or half-written.
    private func replay(user: String, versions: [(version: Int, jobID: String)],
                        jobs: [String: Attune_V1_TrainingJob], replayed: inout Int) throws -> String? {
        guard let first = versions.first else { return nil }
        let stored = try registry.personalVersion(user: user, model: model, version: first.version).info
        let base = try UpdatableModel(spec: ModelFile.decode(
            registry.baseModel(name: model, version: stored.baseVersion).bytes),
            links: registry.linkedModelBytes(name: model, version: stored.baseVersion).mapValues(ModelFile.decode))
        var state: Attune_V1_UpdateState?
        for (expectedVersion, entry) in versions.enumerated() {
            guard entry.version == expectedVersion + 1 else {
                return "user \(user): versions are not 1...n (found v\(entry.version) at position \(expectedVersion + 1))"
            }
            guard let job = jobs[entry.jobID] else { return nil }  // counted as a version without a job
            let task = UpdateTask(model: base, state: state,
                                  batch: try base.prepareBatch(job.samples, maxSamples: .max),
                                  parameters: try base.resolveParameters(job.parameters))
            let result = try task.run(progress: { _ in })
            let saved = try Attune_V1_UpdateState(serializedBytes:
                registry.personalVersion(user: user, model: model, version: entry.version).state)
            replayed += 1
            guard saved == result.state else {
                return "user \(user): v\(entry.version) (job \(entry.jobID)) differs from the sequential replay"
            }
            state = result.state
        }
        return nil
    }

    /// Large objects that neither a base model nor a personal version points at.
    public func orphanedLargeObjects() throws -> Int {
        try registry.orphanedLargeObjectCount()
    }

    /// Reasons with the job-specific parts cut, so a report groups them.
    static func reasonKind(_ reason: String) -> String {
        String(reason.split(separator: ":").first ?? Substring(reason))
    }
}

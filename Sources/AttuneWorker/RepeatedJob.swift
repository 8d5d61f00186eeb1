import AttuneStore

/// A job id that was applied before is either a redelivery (same content: ack it, train nothing) or a
/// producer reusing an id for other work (refuse it: applying it would be silently lost, and applying
/// it anyway would apply an id twice). Versions stored before digests were kept count as the same.
enum RepeatedJob {
    static func outcome(jobId: String, digest: String, applied: PersonalVersionRecord) -> JobOutcome {
        guard let stored = applied.jobDigest, stored != digest else {
            return .alreadyApplied(version: applied.version)
        }
        return .rejected(reason: "job id \(jobId) was already applied as version \(applied.version) of "
            + "\(applied.model) for user \(applied.user) with other content (digest \(stored.prefix(12)), "
            + "this job \(digest.prefix(12))); a job id names one job: publish new work under a new job id")
    }
}

/// One committed version of a personal model, as `attune audit` checks it against the jobs published.
public struct CommittedVersion: Sendable, Equatable {
    public let user: String
    public let version: Int
    /// The job that made it.
    public let jobID: String

    public init(user: String, version: Int, jobID: String) {
        self.user = user
        self.version = version
        self.jobID = jobID
    }
}

/// What `attune audit` reads of a fleet's run from PostgreSQL. The judging is AttuneWorker's FleetAudit.
extension ModelRegistry {
    /// Every committed version of `model`, by user, each user's in version order.
    public func committedVersions(model: String) throws -> [CommittedVersion] {
        try connection.query("""
            SELECT user_id, version, job_id FROM attune_personal_versions WHERE model = $1 ORDER BY user_id, version
            """, [model]).rows.map {
                CommittedVersion(user: try $0.string("user_id"), version: try $0.int("version"), jobID: try $0.string("job_id"))
            }
    }

    /// Large objects that neither a base model nor a personal version points at (none, unless a write was
    /// torn or a delete forgot its object).
    public func orphanedLargeObjectCount() throws -> Int {
        try connection.query("""
            SELECT count(*) FROM pg_largeobject_metadata m
            WHERE NOT EXISTS (SELECT 1 FROM attune_base_models b WHERE b.model_lo = m.oid)
              AND NOT EXISTS (SELECT 1 FROM attune_personal_versions v WHERE v.state_lo = m.oid)
            """).int(0, 0)
    }
}

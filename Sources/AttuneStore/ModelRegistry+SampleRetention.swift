public import Foundation

/// Samples kept on purpose: a model's retention period, the jobs kept with its versions, and pruning them.
/// What is kept is what a rebase onto a new base model replays, user by user, in version order.
extension ModelRegistry {
    /// Keeps `model`'s jobs with their versions for `period` (a PostgreSQL interval such as `30 days`), or
    /// keeps none from now on (nil; what was kept goes at the next prune).
    public func setSampleRetention(model: String, period: String?) throws {
        do {
            try connection.query("""
                INSERT INTO attune_model_settings (model, sample_retention) VALUES ($1, $2::interval)
                ON CONFLICT (model) DO UPDATE SET sample_retention = excluded.sample_retention, updated_at = now()
                """, [model, period])
        } catch let error as DatabaseError where error.sqlState?.hasPrefix("22") == true || error.sqlState == "23514" {
            throw RegistryError.invalidArgument("retention period \(period ?? "off"): \(error.message)")
        }
    }

    /// The retention period as PostgreSQL writes it (`30 days`), or nil when the model keeps nothing.
    public func sampleRetention(model: String) throws -> String? {
        try connection.query("SELECT justify_hours(sample_retention)::text AS period FROM attune_model_settings WHERE model = $1",
                             [model]).rows.first.flatMap { try $0.optionalString("period") }
    }

    /// What `model` keeps now: jobs, samples and stored bytes (sealed).
    public func retainedSamples(model: String) throws -> RetainedSamples {
        let row = try connection.query("""
            SELECT count(*) AS jobs, coalesce(sum(samples), 0) AS samples, coalesce(sum(size_bytes), 0) AS bytes,
                   count(DISTINCT user_id) AS users
            FROM attune_retained_jobs WHERE model = $1
            """, [model])[0]
        return RetainedSamples(jobs: try row.int("jobs"), samples: try row.int("samples"), bytes: try row.int64("bytes"),
                               users: try row.int("users"))
    }

    /// The jobs kept for `user`'s line of `model`, oldest version first, opened.
    public func retainedJobs(user: String, model: String) throws -> [(version: Int, job: Data)] {
        try connection.query("""
            SELECT version, base_version, encode(lo_get(job_lo), 'base64') AS job
            FROM attune_retained_jobs WHERE user_id = $1 AND model = $2 ORDER BY version
            """, [user, model]).rows.map { row in
                let version = try row.int("version")
                guard let sealed = try row.base64Bytes("job") else {
                    throw DatabaseError(kind: .decoding, operation: "read kept jobs", message: "version \(version) has no job")
                }
                return (version, try openObject(sealed, as: .retainedJob(model: model, baseVersion: try row.int("base_version"),
                                                                         user: user, version: version)))
            }
    }

    /// Deletes kept jobs older than their model's period, and every kept job of a model whose retention is
    /// off; `model` limits it to one model. Returns how many went (their large objects with them).
    @discardableResult
    public func pruneRetainedSamples(model: String? = nil) throws -> Int {
        try connection.query("""
            DELETE FROM attune_retained_jobs r
            WHERE ($1::text IS NULL OR r.model = $1)
              AND NOT EXISTS (SELECT 1 FROM attune_model_settings s
                              WHERE s.model = r.model AND s.sample_retention IS NOT NULL
                                AND r.retained_at >= now() - s.sample_retention)
            """, [model]).affectedRows
    }
}

/// What a model keeps (`attune model describe`).
public struct RetainedSamples: Sendable, Equatable, Codable {
    public let jobs: Int
    public let samples: Int
    /// Sealed bytes stored, envelopes included.
    public let bytes: Int64
    public let users: Int

    public init(jobs: Int, samples: Int, bytes: Int64, users: Int) {
        self.jobs = jobs
        self.samples = samples
        self.bytes = bytes
        self.users = users
    }

    /// Stored bytes per kept sample; nil with none kept.
    public var bytesPerSample: Double? { samples > 0 ? Double(bytes) / Double(samples) : nil }
}

public import Foundation

/// The quality gate before delivery: a model's floor and allowed drop for validation accuracy, the versions
/// held by it, what devices get meanwhile, and releasing a hold. The decision is made in the commit's own
/// statement (`attune_gate_reason`, migration 0020), so a version is never visible unjudged.
extension ModelRegistry {
    /// Sets `model`'s gate: hold a version whose validation accuracy is below `minAccuracy`, or more than
    /// `maxDrop` below the version devices get now. Both nil: no gate.
    public func setQualityGate(model: String, minAccuracy: Double?, maxDrop: Double?) throws {
        for value in [minAccuracy, maxDrop].compactMap({ $0 }) where !(0...1).contains(value) {
            throw RegistryError.invalidArgument("gate values are fractions between 0 and 1, got \(value)")
        }
        try connection.query("""
            INSERT INTO attune_model_settings (model, gate_min_accuracy, gate_max_drop) VALUES ($1, $2, $3)
            ON CONFLICT (model) DO UPDATE SET gate_min_accuracy = excluded.gate_min_accuracy,
                                              gate_max_drop = excluded.gate_max_drop, updated_at = now()
            """, [model, minAccuracy, maxDrop])
    }

    /// `model`'s gate, or nil when it has none.
    public func qualityGate(model: String) throws -> QualityGate? {
        guard let row = try connection.query("""
            SELECT gate_min_accuracy, gate_max_drop FROM attune_model_settings
            WHERE model = $1 AND (gate_min_accuracy IS NOT NULL OR gate_max_drop IS NOT NULL)
            """, [model]).rows.first else { return nil }
        return QualityGate(minAccuracy: try row.optionalDouble("gate_min_accuracy"), maxDrop: try row.optionalDouble("gate_max_drop"))
    }

    /// The version a device of `user` gets for `model`'s line: the newest not held (0: the plain base).
    public func deliveredVersion(user: String, model: String) throws -> Int {
        try connection.query("SELECT attune_delivered_version($1, $2)", [user, model]).int(0, 0)
    }

    /// Versions held by the gate (released ones too, with when), oldest first; `jobIds` narrows to those jobs'.
    public func heldVersions(user: String? = nil, model: String, jobIds: [String]? = nil) throws -> [HeldVersion] {
        try connection.query("""
            SELECT h.user_id, h.version, h.reason, v.job_id, extract(epoch FROM h.released_at)::float8 AS released_at
            FROM attune_held_versions h
            JOIN attune_personal_versions v ON v.user_id = h.user_id AND v.model = h.model AND v.version = h.version
            WHERE h.model = $1 AND ($2::text IS NULL OR h.user_id = $2)
              AND ($3::text[] IS NULL OR v.job_id = ANY ($3::text[]))
            ORDER BY h.user_id, h.version
            """, [model, user, jobIds.map { PostgresArray($0) }]).rows.map { row in
                HeldVersion(user: try row.string("user_id"), version: try row.int("version"), jobId: try row.string("job_id"),
                            reason: try row.string("reason"),
                            releasedAt: try row.optionalDouble("released_at").map { Date(timeIntervalSince1970: $0) })
            }
    }

    /// Why the gate holds the versions of `jobIds`, for those it holds (and has not released).
    public func heldReasons(jobIds: [String]) throws -> [String: String] {
        guard !jobIds.isEmpty else { return [:] }
        return Dictionary(uniqueKeysWithValues: try connection.query("""
            SELECT v.job_id, h.reason FROM attune_held_versions h
            JOIN attune_personal_versions v ON v.user_id = h.user_id AND v.model = h.model AND v.version = h.version
            WHERE v.job_id = ANY ($1::text[]) AND h.released_at IS NULL
            """, [PostgresArray(jobIds)]).rows.map { (try $0.string("job_id"), try $0.string("reason")) })
    }

    /// The version devices of `user` get for `model`'s line and its base, nil for the plain base.
    public func deliveredHead(user: String, model: String) throws -> (version: Int, baseVersion: Int)? {
        try connection.query("""
            SELECT v.version, v.base_version FROM attune_personal_versions v
            WHERE v.user_id = $1 AND v.model = $2 AND v.version = attune_delivered_version($1, $2)
            """, [user, model]).rows.first.map { (try $0.int("version"), try $0.int("base_version")) }
    }

    /// Ends the holds on `user`'s versions of `model` up to `version` (all of them when nil); devices then
    /// get the newest version. Returns the versions released.
    @discardableResult
    public func releaseHeldVersions(user: String, model: String, upTo version: Int? = nil) throws -> [Int] {
        try connection.query("""
            UPDATE attune_held_versions SET released_at = now()
            WHERE user_id = $1 AND model = $2 AND released_at IS NULL AND ($3::integer IS NULL OR version <= $3)
            RETURNING version
            """, [user, model, version]).rows.map { try $0.int("version") }.sorted()
    }
}

public struct QualityGate: Sendable, Equatable {
    public let minAccuracy: Double?
    public let maxDrop: Double?

    public init(minAccuracy: Double?, maxDrop: Double?) {
        self.minAccuracy = minAccuracy
        self.maxDrop = maxDrop
    }
}

public struct HeldVersion: Sendable, Equatable {
    public let user: String
    public let version: Int
    public let jobId: String
    public let reason: String
    public let releasedAt: Date?
}

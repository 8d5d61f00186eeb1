public import Foundation

/// Whether a model takes its users' devices' own training, and within which limits (migration 0027).
public struct UploadPolicy: Sendable, Equatable {
    /// The largest L2 norm of one upload's change (its parameters minus those it was trained from).
    public let maxChangeNorm: Double
    /// How many versions behind the head a change may be for the server to apply it onto the head.
    public let maxStaleVersions: Int

    public init(maxChangeNorm: Double, maxStaleVersions: Int) {
        self.maxChangeNorm = maxChangeNorm
        self.maxStaleVersions = maxStaleVersions
    }
}

extension ModelRegistry {
    /// Lets `model`'s users' devices upload what they trained (`policy`), or stops them (nil). Off by default:
    /// a model whose app never trains on the device takes no uploads at all.
    public func setUploadPolicy(model: String, _ policy: UploadPolicy?) throws {
        if let policy {
            guard policy.maxChangeNorm > 0, policy.maxChangeNorm.isFinite else {
                throw RegistryError.invalidArgument("the largest change norm must be a positive number, got \(policy.maxChangeNorm)")
            }
            guard policy.maxStaleVersions >= 0 else {
                throw RegistryError.invalidArgument("the stale-version limit cannot be negative, got \(policy.maxStaleVersions)")
            }
        }
        _ = try baseModel(name: model, version: nil)
        try connection.query("""
            INSERT INTO attune_model_settings (model, upload_max_change_norm, upload_max_stale_versions) VALUES ($1, $2, $3)
            ON CONFLICT (model) DO UPDATE SET upload_max_change_norm = excluded.upload_max_change_norm,
                                              upload_max_stale_versions = excluded.upload_max_stale_versions, updated_at = now()
            """, [model, policy?.maxChangeNorm, policy?.maxStaleVersions ?? 8])
    }

    /// `model`'s upload policy, with whether it has a quality gate (the commit then judges the device's
    /// reported validation accuracy); nil while uploads are off.
    public func uploadPolicy(model: String) throws -> (policy: UploadPolicy, gated: Bool)? {
        guard let row = try connection.query("""
            SELECT upload_max_change_norm, upload_max_stale_versions,
                   (gate_min_accuracy IS NOT NULL OR gate_max_drop IS NOT NULL) AS gated
            FROM attune_model_settings WHERE model = $1 AND upload_max_change_norm IS NOT NULL
            """, [model]).rows.first else { return nil }
        return (UploadPolicy(maxChangeNorm: try row.double("upload_max_change_norm"),
                             maxStaleVersions: try row.int("upload_max_stale_versions")),
                try row.bool("gated"))
    }
}

/// A version a device uploaded, with the state it was applied onto: what a rebase carries to the new base as
/// the device's change (`state` minus `parentState`).
public struct DeviceChange: Sendable {
    public let version: Int
    /// The base both states are on.
    public let baseVersion: Int
    public let parentVersion: Int
    public let state: Data
    /// nil when the parent is version 0: the base's own tensors.
    public let parentState: Data?
}

extension ModelRegistry {
    /// The user's versions that devices uploaded, oldest first, each with its parent's state. Throws
    /// `RegistryError.prunedVersion` when a state it needs was pruned (the change can no longer be told).
    public func deviceChanges(user: String, model: String) throws -> [DeviceChange] {
        let versions = try connection.query("""
            SELECT version, parent_version, base_version FROM attune_personal_versions
            WHERE user_id = $1 AND model = $2 AND worker LIKE 'device:%' ORDER BY version
            """, [user, model]).rows.map { (try $0.int("version"), try $0.int("parent_version"), try $0.int("base_version")) }
        return try versions.map { version, parent, base in
            DeviceChange(version: version, baseVersion: base, parentVersion: parent,
                         state: try personalVersion(user: user, model: model, version: version).state,
                         parentState: parent > 0 ? try personalVersion(user: user, model: model, version: parent).state : nil)
        }
    }
}

extension ModelRegistry {
    /// Advisory lock class of device uploads, one lock per job id (beside the leases' 417001 and 417002 and the
    /// commit's and cancel's 417003).
    static let uploadClass: Int32 = 417_004

    /// Runs `body` holding this session's lock on `jobId`: two requests carrying one idempotency key (a retry
    /// sent while the first is still deciding) take turns, so the second finds the first's version.
    public func whileHoldingUpload<T>(jobId: String, _ body: () throws -> T) throws -> T {
        try connection.query("SELECT pg_advisory_lock($1, hashtext($2))", [Int(Self.uploadClass), jobId])
        defer { _ = try? connection.query("SELECT pg_advisory_unlock($1, hashtext($2))", [Int(Self.uploadClass), jobId]) }
        return try body()
    }
}

import Foundation
// TEMPORARY naive stand-in until the batched store lands.
public struct UserModel: Hashable, Sendable {
    public let user: String
    public let model: String
    public init(user: String, model: String) { self.user = user; self.model = model }
}
public struct HeadSnapshot: Sendable, Equatable { public let version: Int; public let baseVersion: Int; public let state: Data }
public struct JobLookup: Sendable {
    public var applied: [String: PersonalVersionRecord] = [:]
    public var heads: [UserModel: HeadSnapshot] = [:]
    public var baseOfNewLines: [UserModel: Int] = [:]
    public var newestBase: [String: Int] = [:]
}
extension ModelRegistry {
    public func lookup(jobIds: [String], heads: [UserModel], models: [String]) throws -> JobLookup {
        var result = JobLookup()
        for id in jobIds { if let v = try versionApplied(jobId: id) { result.applied[id] = v } }
        for key in heads {
            if let h = try headState(user: key.user, model: key.model) {
                result.heads[key] = HeadSnapshot(version: h.info.version, baseVersion: h.info.baseVersion, state: h.state)
            } else {
                let r = try connection.query("SELECT base_version FROM attune_personal_heads WHERE user_id = $1 AND model = $2", [key.user, key.model])
                if r.rowCount == 1 { result.baseOfNewLines[key] = try r.int(0, 0) }
            }
        }
        for m in models { if let b = try? baseModel(name: m, version: nil) { result.newestBase[m] = b.record.version } }
        return result
    }
    public func commitVersions(_ versions: [NewPersonalVersion]) throws -> [Result<CommitOutcome, RegistryError>] {
        try versions.map { v in
            do { return .success(try commitVersion(v)) } catch let e as RegistryError { return .failure(e) }
        }
    }
}

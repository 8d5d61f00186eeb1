public import Foundation

/// One user's line of versions of one model.
public struct UserModel: Hashable, Sendable {
    public let user: String
    public let model: String

    public init(user: String, model: String) {
        self.user = user
        self.model = model
    }
}

/// Where a user's line stands, with the update state a task starts from.
public struct HeadSnapshot: Sendable, Equatable {
    public let version: Int
    public let baseVersion: Int
    public let state: Data

    public init(version: Int, baseVersion: Int, state: Data) {
        self.version = version
        self.baseVersion = baseVersion
        self.state = state
    }
}

/// What a worker needs to know before training a batch of jobs, read in one statement (one snapshot,
/// so heads and their states belong together).
public struct JobLookup: Sendable {
    /// job id -> the version it was applied as (only ids that were applied)
    public var applied: [String: PersonalVersionRecord]
    /// (user, model) -> head at version > 0 with its update state bytes; absent = user at version 0
    /// (or head row at 0, whose base_version is in `baseOfNewLines`)
    public var heads: [UserModel: HeadSnapshot]
    /// (user, model) whose head row exists at version 0 -> that row's base_version
    public var baseOfNewLines: [UserModel: Int]
    /// model name -> the base version new lines start on: the default deployment's, else the newest
    /// import (absent: no such model)
    public var newestBase: [String: Int]
    /// (user, model) whose head is still the version the caller said it knows: no state was sent
    public var unchangedHeads: [UserModel: HeadVersion] = [:]
    /// job id -> the reason given, for ids that were cancelled
    public var cancelled: [String: String] = [:]
    /// (user, model) whose head state this process cannot decrypt (a key it lacks): not in `heads`
    public var unreadableHeads: [UserModel: StorageKeyError] = [:]
    /// Models that keep their jobs' samples with each version (`attune model retention`)
    public var retainsSamples: Set<String> = []
    /// Models with a quality gate (`attune model gate`): their versions may be held at the commit
    public var gatedModels: Set<String> = []
    /// (user, model) whose user was forgotten (`attune user forget`): their jobs are dropped, never trained
    public var forgotten: Set<UserModel> = []

    /// Why a job of a forgotten user is dropped untrained (its `cancelled` event says so).
    public static let forgottenReason = "the user was forgotten (attune user forget): the job is dropped untrained"

    /// A head's version and base, without its state.
    public struct HeadVersion: Sendable, Equatable {
        public let version: Int
        public let baseVersion: Int

        public init(version: Int, baseVersion: Int) {
            self.version = version
            self.baseVersion = baseVersion
        }
    }

    public init(applied: [String: PersonalVersionRecord] = [:], heads: [UserModel: HeadSnapshot] = [:],
                baseOfNewLines: [UserModel: Int] = [:], newestBase: [String: Int] = [:]) {
        self.applied = applied
        self.heads = heads
        self.baseOfNewLines = baseOfNewLines
        self.newestBase = newestBase
    }
}

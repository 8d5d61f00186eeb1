// `buildCommit` and `buildDirty` are written at build time by the AttuneBuildCommit plugin. They stay internal, and
// this module holds nothing else, so a new commit recompiles this one file and nothing that imports it.

/// The commit this binary was built from: the image build's ATTUNE_REVISION, else git's HEAD; "unknown" when the
/// build had neither.
public func attuneBuildCommit() -> String { buildCommit.isEmpty ? "unknown" : buildCommit }

/// Whether the work tree had uncommitted changes when this binary was built.
public func attuneBuildDirty() -> Bool { buildDirty }

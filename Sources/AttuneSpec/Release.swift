/// Which release of Attune this is: `attune --version`, the worker's first log line, and the
/// `attune_build_info` metric, so an operator rolling out a new release can see which workers run which.
/// Bumped with each release's entry in the changelog.
public enum AttuneRelease {
    public static let version = "0.38.0"
}

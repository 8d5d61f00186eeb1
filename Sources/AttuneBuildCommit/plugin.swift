import Foundation
import PackagePlugin

/// Writes the commit this build is made from into AttuneBuildInfo (`BuildCommit.swift`), for AttuneRelease.identity
/// (`attune --version`, `0.40.0-dev+4d711af`). A prebuild command, so it runs at every build: a value computed in
/// Package.swift (Context.gitInformation) is cached with the manifest and stays the first commit built until
/// Package.swift itself changes. The file is rewritten only when its text changes, so an unchanged commit
/// recompiles nothing.
@main
struct AttuneBuildCommit: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let output = context.pluginWorkDirectoryURL.appending(path: "generated")
        // The image build copies no .git and passes the commit as ATTUNE_REVISION (deploy/Dockerfile; its ARG says
        // "unknown" when not given); a checkout asks git, and marks a work tree with changes (untracked files
        // included, ignored ones not) `dirty`. GIT_OPTIONAL_LOCKS=0: `git status` must not take the index lock
        // from someone committing in the same work tree.
        let script = #"""
            set -e
            if [ -n "$ATTUNE_REVISION" ] && [ "$ATTUNE_REVISION" != unknown ]; then
              commit=$ATTUNE_REVISION dirty=false
            else
              commit=$(git -C "$PACKAGE" rev-parse HEAD 2>/dev/null) || commit=unknown
              dirty=false
              if [ "$commit" != unknown ] && [ -n "$(git -C "$PACKAGE" status --porcelain 2>/dev/null)" ]; then dirty=true; fi
            fi
            commit=$(printf %s "$commit" | tr -cd 0-9A-Za-z)
            text="// Written at build time by the AttuneBuildCommit plugin (Sources/AttuneBuildCommit).
            let buildCommit = \"$commit\"
            let buildDirty = $dirty"
            mkdir -p "$OUTPUT"
            [ "$(cat "$OUTPUT/BuildCommit.swift" 2>/dev/null)" = "$text" ] || printf '%s\n' "$text" >"$OUTPUT/BuildCommit.swift"
            """#
        let environment = ProcessInfo.processInfo.environment
        return [.prebuildCommand(displayName: "the build's commit for AttuneRelease",
                                 executable: URL(filePath: "/bin/sh"), arguments: ["-c", script],
                                 environment: ["OUTPUT": output.path, "PACKAGE": context.package.directoryURL.path,
                                               "ATTUNE_REVISION": environment["ATTUNE_REVISION"] ?? "",
                                               "GIT_OPTIONAL_LOCKS": "0", "PATH": environment["PATH"] ?? "/usr/bin:/bin"],
                                 outputFilesDirectory: output)]
    }
}

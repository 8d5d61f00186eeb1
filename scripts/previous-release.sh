#!/usr/bin/env bash
# The previous release of Attune, for the upgrade drill: prints a folder holding its `attune` binary (a debug
# build) and its `migrations/`. Built from the release's commit in this repository's history the first time,
# into a cache outside the work tree (ATTUNE_RELEASE_CACHE, default ~/.cache/attune/releases), so later runs
# on the same machine skip the three-minute build.
#
# Each release moves the pin below to the release it replaces (docs/upgrades.md, "Cutting a release").
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.38.0
commit=ecacc8bfb72a3bc156f9ff65cb5db708c9c335b4

cache=${ATTUNE_RELEASE_CACHE:-$HOME/.cache/attune/releases}/$version-${commit:0:7}
if [ -x "$cache/attune" ] && [ -d "$cache/migrations" ] && [ "$("$cache/attune" --version 2>/dev/null)" = "$version" ]; then
  echo "$cache"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "previous-release.sh: commit $commit (release $version) is not in this clone's history; fetch it (a shallow clone lacks it)" >&2
  exit 1
fi
source=$(mktemp -d /tmp/attune-release-$version.XXXXXX)
trap 'rm -rf "$source"' EXIT
git archive "$commit" | tar -x -C "$source"
# The same dependency versions as this checkout resolved, where it has resolved them.
[ -f Package.resolved ] && cp Package.resolved "$source/"
echo "previous-release.sh: building release $version ($commit) once, into $cache" >&2
mkdir -p "$cache"
if ! (cd "$source" && swift build --product attune --scratch-path "$cache/build" >"$cache/build.log" 2>&1); then
  tail -n 30 "$cache/build.log" >&2
  echo "previous-release.sh: the build of release $version failed (log: $cache/build.log)" >&2
  exit 1
fi
cp "$cache/build/debug/attune" "$cache/attune"
rm -rf "$cache/migrations" && cp -R "$source/migrations" "$cache/migrations"
# The build folder is only needed to make the binary; the binary alone is kept.
rm -rf "$cache/build"
[ "$("$cache/attune" --version)" = "$version" ] || { echo "previous-release.sh: the binary built is not release $version" >&2; exit 1; }
echo "$cache"

#!/usr/bin/env bash
# The previous release of Attune, for the upgrade drill: prints a folder holding its `attune` binary (a debug
# build) and its `migrations/`. Built from the release's commit in this repository's history the first time,
# into a cache outside the work tree (ATTUNE_RELEASE_CACHE, default ~/.cache/attune/releases), so later runs
# on the same machine skip the three-minute build.
#
# Each release moves the pin below to the release it replaces, and the commit it was cut from, as CHANGELOG.md
# names it (docs/upgrades.md, "Cutting a release").
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.39.0
commit=4d711afc3c0a41dc941f7f91cdee6d725717fa1e

cache=${ATTUNE_RELEASE_CACHE:-$HOME/.cache/attune/releases}/$version-${commit:0:7}
# What the binary must say: releases before 0.40.0 print their number alone, later ones their identity with the
# commit (`0.40.0+9c1e2b7`), which the build below passes in as ATTUNE_REVISION (a git archive has no .git).
is_release() { local said; said=$("$1" --version 2>/dev/null) && { [ "$said" = "$version" ] || [ "$said" = "$version+${commit:0:7}" ]; }; }
if [ -x "$cache/attune" ] && [ -d "$cache/migrations" ] && is_release "$cache/attune"; then
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
if ! (cd "$source" && ATTUNE_REVISION=$commit swift build --product attune --scratch-path "$cache/build" >"$cache/build.log" 2>&1); then
  tail -n 30 "$cache/build.log" >&2
  echo "previous-release.sh: the build of release $version failed (log: $cache/build.log)" >&2
  exit 1
fi
cp "$cache/build/debug/attune" "$cache/attune"
rm -rf "$cache/migrations" && cp -R "$source/migrations" "$cache/migrations"
# The build folder is only needed to make the binary; the binary alone is kept.
rm -rf "$cache/build"
is_release "$cache/attune" || { echo "previous-release.sh: the binary built says $("$cache/attune" --version), not release $version (${commit:0:7})" >&2; exit 1; }
echo "$cache"

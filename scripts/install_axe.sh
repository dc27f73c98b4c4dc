#!/usr/bin/env bash
# axe-core, the accessibility engine the browser tests run on the book, a feedback page and the
# class report (WCAG 2.1 A and AA rules). Installs the npm package `axe-core` (pinned) and keeps its
# one script in .cache/axe/ (not in the book: readers never load it).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=4.11.0
dest=.cache/axe
if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$VERSION" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "npm is needed to install axe-core (apt-get install nodejs npm)" >&2; exit 1; }
npm install --no-save --no-audit --no-fund --prefix .cache/npm-axe "axe-core@$VERSION" >/dev/null
rm -rf "$dest" && mkdir -p "$dest"
cp .cache/npm-axe/node_modules/axe-core/axe.min.js "$dest/"
echo "$VERSION" > "$dest/VERSION"
echo "axe-core $VERSION installed in $dest"

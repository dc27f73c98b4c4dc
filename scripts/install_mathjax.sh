#!/usr/bin/env bash
# Serve MathJax from the book itself, so math renders offline (no CDN).
# Installs the npm package `mathjax` (pinned) and copies what the CommonHTML
# renderer loads into _vendor/mathjax/; Sphinx copies it to _static/mathjax/ in the build.
# (Not into a root _static/: Jupyter Book would add every .js file found there to every page.)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=3.2.2
dest=_vendor/mathjax
if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$VERSION" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "npm is needed to install MathJax (apt-get install nodejs npm)" >&2; exit 1; }
npm install --no-save --no-audit --no-fund --prefix .cache/npm "mathjax@$VERSION" >/dev/null
src=.cache/npm/node_modules/mathjax/es5
rm -rf "$dest" && mkdir -p "$dest/output"
cp "$src/tex-chtml.js" "$dest/"
cp -r "$src/input" "$src/ui" "$src/a11y" "$dest/"
cp -r "$src/output/chtml" "$dest/output/"
echo "$VERSION" > "$dest/VERSION"
echo "MathJax $VERSION installed in $dest"

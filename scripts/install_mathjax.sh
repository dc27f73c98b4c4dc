#!/usr/bin/env bash
# Serve MathJax from the book itself, so math renders offline (no CDN).
# Installs the npm packages `mathjax` and its default font `@mathjax/mathjax-newcm-font` (pinned)
# and copies what the CommonHTML renderer loads into _vendor/mathjax/; Sphinx copies it to
# _static/mathjax/ in the build. (Not into a root _static/: Jupyter Book would add every .js file
# found there to every page.) MathJax 4 breaks a display equation wider than the column into lines
# (`displayOverflow: linebreak` in _config.yml), which MathJax 3 could not: on a phone, long
# equations fit instead of scrolling sideways. The font's files go to _vendor/mathjax/fonts/, which
# the configuration names as MathJax's `fonts` path (its default is a CDN).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=4.1.3
dest=_vendor/mathjax
if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$VERSION" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "npm is needed to install MathJax (apt-get install nodejs npm)" >&2; exit 1; }
npm install --no-save --no-audit --no-fund --prefix .cache/npm "mathjax@$VERSION" "@mathjax/mathjax-newcm-font@$VERSION" >/dev/null
src=.cache/npm/node_modules/mathjax
font=.cache/npm/node_modules/@mathjax/mathjax-newcm-font
rm -rf "$dest" && mkdir -p "$dest/fonts/mathjax-newcm-font"
cp "$src/tex-chtml.js" "$dest/"
# the TeX extensions loaded on demand, the accessibility extensions (assistive MathML, and the speech
# rule engine with its local maps for the reading aloud MathJax 4 offers), the context menu
cp -r "$src/input" "$src/a11y" "$src/sre" "$src/ui" "$dest/"
cp -r "$font/chtml" "$font/chtml.js" "$dest/fonts/mathjax-newcm-font/"
echo "$VERSION" > "$dest/VERSION"
echo "MathJax $VERSION installed in $dest"

#!/usr/bin/env bash
# Debian packages the tests need: Chromium and its driver (browser test of the book),
# bubblewrap (the autograder's sandbox) and the PostgreSQL server (the PostgreSQL gradebook test
# starts a throwaway one; Debian keeps initdb and pg_ctl in /usr/lib/postgresql/<version>/bin).
# Installs them when missing and we may (root or sudo); otherwise says what to install.
set -euo pipefail
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v npm >/dev/null || missing+=(npm)
command -v bwrap >/dev/null || missing+=(bubblewrap)
compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || command -v pg_ctl >/dev/null || missing+=(postgresql)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else
  echo "please install: ${missing[*]} (Debian/Ubuntu: apt-get install ${missing[*]})" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "installed: ${missing[*]}"

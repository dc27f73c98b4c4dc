#!/usr/bin/env bash
# The Debian/Ubuntu packages a job of the course needs, installed when missing and we may (as root
# or with sudo); otherwise the exact command to run is printed and the script fails.
#   scripts/system_deps.sh book   # building the book: python3-venv, npm (the local copy of MathJax)
#   scripts/system_deps.sh test   # the test suite: the above, Chromium and its driver (browser tests),
#                                 # bubblewrap (the autograder's sandbox), PostgreSQL (a throwaway
#                                 # gradebook server; Debian keeps initdb and pg_ctl in
#                                 # /usr/lib/postgresql/<version>/bin) and its client (pg_dump)
# `make book` and `make test` run it; so does CI.
set -euo pipefail
job="${1:-test}"
case "$job" in book|test) ;; *) echo "usage: $0 book|test" >&2; exit 2 ;; esac
missing=()
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
command -v npm >/dev/null || missing+=(npm)
if [ "$job" = test ]; then
  command -v chromium >/dev/null || missing+=(chromium)
  command -v chromedriver >/dev/null || missing+=(chromium-driver)
  command -v bwrap >/dev/null || missing+=(bubblewrap)
  compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || command -v pg_ctl >/dev/null || missing+=(postgresql)
  command -v pg_dump >/dev/null || missing+=(postgresql-client)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then sudo=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo"
else
  echo "the $job job needs these Debian/Ubuntu packages; install them, then run make again:" >&2
  echo "  sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "installed: ${missing[*]}"

#!/bin/sh
# tests/scripts/layering.sh - the one-way rule of HACKING.md ("Layers"), read
# off the #include lines of the product code:
#
#   util/     includes only util/ headers and the C library: it is below
#             everything and linked by every target
#   compare/  includes only compare/ and util/ headers, jansson and the C
#             library
#   storage/  the only product code that includes sqlite3.h; never daemon/,
#             api/ or cli/
#   daemon/   (with its rooms in subfolders) never api/ or cli/
#             (daemon/main.c, the program itself, wires api/ onto the
#             daemon and is the one file that may)
#   api/      never cli/
#   cli/      capctl: only cli/ and util/ headers, libcurl, jansson and the
#             C library (it talks HTTP to capd and shares no code with it
#             but util/, the bottom library every target links)
#   worker/   capd-cell: only worker/ and util/ headers, libcurl, jansson and
#             the C library (it talks HTTP to capd and runs on other hosts);
#             no other folder includes worker/
#
#   layering.sh SOURCE_DIR      prints every breach; exit 1 if there is one
set -u
ROOT=${1:?source dir}
cd "$ROOT" || exit 2
bad=0

# breach DIR PATTERN WHY [EXCEPT]: an #include line of DIR/*.[ch] matching
# the extended regex PATTERN breaks the rule WHY (file EXCEPT aside).
breach() {
    dir=$1 pat=$2 why=$3 except=${4:-}
    for f in $(find "$dir" -name '*.[ch]' | sort); do
        [ -f "$f" ] || continue
        [ "$f" = "$except" ] && continue
        grep -nE "^[[:space:]]*#[[:space:]]*include[[:space:]]*$pat" "$f" |
            while IFS= read -r line; do
                echo "layering: $f:$line: $why"
            done
    done
}

out=$(
    breach util '("(api|cli|compare|daemon|storage|runner|gpu|tests|worker)/|<(uv|sqlite3|microhttpd|curl/curl|zstd|xxhash|jansson|criterion/criterion)\.h>)' \
        "util/ depends on nothing but the C library"
    breach compare '("(api|cli|daemon|storage|runner|gpu|worker)/|<(uv|sqlite3|microhttpd|curl/curl|zstd|xxhash)\.h>)' \
        "compare/ depends on nothing but util/, jansson and the C library"
    breach worker '("(api|cli|compare|daemon|storage|runner|gpu|tests)/|<(uv|sqlite3|microhttpd|zstd|xxhash|criterion/criterion)\.h>)' \
        "worker/ depends on nothing but util/, libcurl, jansson and the C library"
    for d in api cli compare daemon gpu util worker; do
        breach "$d" '<sqlite3\.h>' "only storage/ includes sqlite3.h"
    done
    breach storage '"(daemon|api|cli|worker)/' "storage/ is below daemon/ and api/"
    breach daemon '"(api|cli|worker)/' "daemon/ is below api/" daemon/main.c
    breach api '"(cli|worker)/' "api/ does not use capctl's or capd-cell's code"
    breach cli '("(api|compare|daemon|storage|runner|gpu|tests|worker)/|<(uv|sqlite3|microhttpd|zstd|xxhash|criterion/criterion)\.h>)' \
        "cli/ depends on nothing but util/, libcurl, jansson and the C library (capctl talks HTTP)"
)
if [ -n "$out" ]; then
    echo "$out"
    bad=1
fi
n=$(find util compare storage daemon api cli worker -name '*.c' 2>/dev/null | wc -l)
[ "$n" -gt 20 ] || { echo "layering: only $n source files found under $ROOT"; exit 2; }
[ $bad -eq 0 ] && echo "layering: $n product source files keep the one-way rule"
exit $bad

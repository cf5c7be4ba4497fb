#!/bin/sh
# gpu/verify/fetch-debs.sh - downloads into .debs/ what gpu/verify/run.sh
# needs to build and run capd on a GPU host that has no package registry:
# the -dev packages of capd's dependencies, their libraries (with GnuTLS and
# its own dependencies, for libmicrohttpd), libcurl and its libraries
# (capd-cell), and pkgconf. About 12 MB; run.sh unpacks them under
# /tmp/deps only.
#
# The packages are always Debian 12 (bookworm)'s, whatever this machine
# runs: they need glibc 2.36, which the GPU host's image (glibc 2.39)
# satisfies, while a newer release's (Debian 13: glibc 2.41) would not load
# there. On bookworm apt's own configuration serves; on any other release
# the script uses a private apt configuration (in $TMPDIR/capd-fetch-debs-apt)
# whose one source is bookworm on this system's own Debian mirror
# (deb.debian.org when it names none), and leaves the system's apt
# untouched. CAPD_DEBS_PRIVATE_APT=1 takes that path on bookworm too.
set -eu
mkdir -p .debs
cd .debs
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
APT_OPTS=""
if [ "$codename" != bookworm ] || [ "${CAPD_DEBS_PRIVATE_APT:-}" = 1 ]; then
    # The system's mirror: the first Debian URI of its sources (deb822 or
    # one-line style) that is not the security archive.
    mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
        sed -n -e 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' \
            -e 's/^deb[[:space:]]\{1,\}\(\[[^]]*\][[:space:]]*\)\{0,1\}\([^[:space:]]*\).*/\2/p' |
        grep -v security | head -1)
    mirror=${mirror:-http://deb.debian.org/debian}
    apt_dir="${TMPDIR:-/tmp}/capd-fetch-debs-apt"
    echo "fetch-debs: this machine runs ${codename:-an unknown release}; taking bookworm's packages" \
        "from $mirror through $apt_dir" >&2
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/preferences.d"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror bookworm main" \
        >"$apt_dir/sources.list"
    APT_OPTS="-o Dir::Etc::SourceList=$apt_dir/sources.list -o Dir::Etc::SourceParts=/dev/null
        -o Dir::State::Lists=$apt_dir/lists -o Dir::Cache=$apt_dir/cache
        -o Dir::State::status=/dev/null -o Dir::Etc::Preferences=/dev/null
        -o Dir::Etc::PreferencesParts=$apt_dir/preferences.d -o APT::Architecture=amd64"
    # shellcheck disable=SC2086
    apt-get $APT_OPTS update -q >&2
fi
apt-get $APT_OPTS download libmicrohttpd-dev libmicrohttpd12 libjansson-dev libjansson4 \
    libsqlite3-dev libsqlite3-0 libuv1-dev libuv1 libzstd-dev libzstd1 libxxhash-dev \
    libxxhash0 libcurl4-openssl-dev pkgconf-bin libpkgconf3 libgnutls30 libunistring2 \
    libnettle8 libhogweed6 libtasn1-6 libp11-kit0 libidn2-0 libgmp10 libffi8
# libcurl's own library and what it links, for capd-cell (the remote worker):
# on the GPU image capd-cell did not start without them (libssh2 and libldap
# were missing there; 2026-12-03).
apt-get $APT_OPTS download libcurl4 libbrotli1 libcom-err2 libdb5.3 libgssapi-krb5-2 libk5crypto3 \
    libkeyutils1 libkrb5-3 libkrb5support0 libldap-2.5-0 libnghttp2-14 libpsl5 librtmp1 \
    libsasl2-2 libsasl2-modules-db libssh2-1 libssl3 zlib1g

#!/bin/sh
# gpu/verify/fetch-debs.sh - on a Debian bookworm machine, downloads into
# .debs/ what gpu/verify/run.sh needs to build and run capd on a GPU host
# that has no package registry: the -dev packages of capd's dependencies,
# their libraries (with GnuTLS and its own dependencies, for libmicrohttpd),
# and pkgconf. About 7.5 MB; run.sh unpacks them under /tmp/deps only.
set -eu
mkdir -p .debs
cd .debs
apt-get download libmicrohttpd-dev libmicrohttpd12 libjansson-dev libjansson4 \
    libsqlite3-dev libsqlite3-0 libuv1-dev libuv1 libzstd-dev libzstd1 libxxhash-dev \
    libxxhash0 libcurl4-openssl-dev pkgconf-bin libpkgconf3 libgnutls30 libunistring2 \
    libnettle8 libhogweed6 libtasn1-6 libp11-kit0 libidn2-0 libgmp10 libffi8

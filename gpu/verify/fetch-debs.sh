#!/bin/sh
# gpu/verify/fetch-debs.sh - on a Debian bookworm machine, downloads into
# .debs/ what gpu/verify/run.sh needs to build and run capd on a GPU host
# that has no package registry: the -dev packages of capd's dependencies,
# their libraries (with GnuTLS and its own dependencies, for libmicrohttpd),
# libcurl and its libraries (capd-cell), and pkgconf. About 12 MB; run.sh
# unpacks them under /tmp/deps only.
set -eu
mkdir -p .debs
cd .debs
apt-get download libmicrohttpd-dev libmicrohttpd12 libjansson-dev libjansson4 \
    libsqlite3-dev libsqlite3-0 libuv1-dev libuv1 libzstd-dev libzstd1 libxxhash-dev \
    libxxhash0 libcurl4-openssl-dev pkgconf-bin libpkgconf3 libgnutls30 libunistring2 \
    libnettle8 libhogweed6 libtasn1-6 libp11-kit0 libidn2-0 libgmp10 libffi8
# libcurl's own library and what it links, for capd-cell (the remote worker):
# on the GPU image capd-cell did not start without them (libssh2 and libldap
# were missing there; 2026-12-03).
apt-get download libcurl4 libbrotli1 libcom-err2 libdb5.3 libgssapi-krb5-2 libk5crypto3 \
    libkeyutils1 libkrb5-3 libkrb5support0 libldap-2.5-0 libnghttp2-14 libpsl5 librtmp1 \
    libsasl2-2 libsasl2-modules-db libssh2-1 libssl3 zlib1g

/*
 * tests/helpers/common/tcp.h - a raw TCP connection to a capd on this
 * host, for the tests that speak HTTP byte by byte (hostile requests,
 * connection limits, long-polls held open).
 */
#ifndef CAPD_TESTS_TCP_H
#define CAPD_TESTS_TCP_H

/* A blocking, close-on-exec socket connected to 127.0.0.1:PORT, or -1 when
 * the socket cannot be made or the connection is refused (errno says why). */
int tcp_connect_local(int port);

#endif

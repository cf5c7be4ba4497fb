#!/usr/bin/env python3
"""undeb.py DEB DEST: unpacks a Debian package's files under DEST, like
`dpkg -x`, for hosts without dpkg (an ar archive holding data.tar.*)."""
import io
import sys
import tarfile


def main(path, dest):
    data = open(path, "rb").read()
    if data[:8] != b"!<arch>\n":
        sys.exit("%s: not a Debian package" % path)
    pos = 8
    while pos < len(data):
        hdr = data[pos:pos + 60]
        name, size = hdr[:16].decode().strip().rstrip("/"), int(hdr[48:58])
        body = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            tarfile.open(fileobj=io.BytesIO(body)).extractall(dest)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""A TLS client of the gateway's `tls` door on Python's ssl (OpenSSL underneath).

usage: tls_client.py HOST PORT CA VERSION CIPHER HEX_FRAMES CLOSE
  VERSION 1.3 or 1.2; CIPHER an OpenSSL TLS 1.2 cipher name (TLS 1.3 takes OpenSSL's own);
  HEX_FRAMES login,ping-before,ping-after,logout in hex; CLOSE `server` (the client logs
  out and reads the server's close) or `client` (the client sends close_notify first).
Prints what it saw, a line each; exits 0 once every step went as the protocol says.
"""

import socket
import ssl
import sys

host, port, ca, version, cipher, frames, close = sys.argv[1:8]
login, before, after, logout = (bytes.fromhex(h) for h in frames.split(","))

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(ca)
wanted = ssl.TLSVersion.TLSv1_3 if version == "1.3" else ssl.TLSVersion.TLSv1_2
ctx.minimum_version = ctx.maximum_version = wanted
if version == "1.2":
    ctx.set_ciphers(cipher)
ctx.set_alpn_protocols(["idlegate"])
# A truncated stream raises instead of looking like a clean close.
s = ctx.wrap_socket(socket.create_connection((host, int(port))), server_hostname=host, suppress_ragged_eofs=False)
print("CIPHER", s.cipher()[0], s.version(), flush=True)


def until(token):
    got = b""
    while token not in got:
        try:
            chunk = s.recv(65536)
        except ssl.SSLEOFError:
            print("TRUNCATED", flush=True)
            sys.exit(2)
        if not chunk:
            print("SERVER CLOSED CLEANLY", flush=True)
            sys.exit(3)
        got += chunk


s.sendall(login + before)
until(b"before")
s.sendall(after)
until(b"after")
print("DATA OK", flush=True)
if close == "server":
    s.sendall(logout)
    try:
        while s.recv(65536):
            pass
        print("CLOSE_NOTIFY FROM SERVER", flush=True)
    except ssl.SSLEOFError:
        print("TRUNCATED", flush=True)
        sys.exit(2)
else:
    # Sends close_notify and waits for the server's.
    s.unwrap()
    print("CLOSE_NOTIFY BOTH WAYS", flush=True)

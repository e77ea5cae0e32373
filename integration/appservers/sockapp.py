# A bare-socket HTTP server on the inherited fd 3 that reports what it
# sees: NOTIFY_SOCKET (its mode and owner) and, per request, the
# TCP_NODELAY of the connection as accepted (Python, unlike Go, never sets
# it). Readiness through the sdnotify package (Debian python3-sdnotify)
# when it is there, else by hand. Used by integration/appservers_test.go.
import os
import signal
import socket
import stat
import sys

path = os.environ["NOTIFY_SOCKET"]
if not path.startswith("@"):
    st = os.stat(path)
    print("notify=%s mode=%o uid=%d" % (path, stat.S_IMODE(st.st_mode), st.st_uid), flush=True)
else:
    print("notify=%s" % path, flush=True)
assert os.environ.get("LISTEN_PID") == str(os.getpid())
ls = socket.socket(fileno=3)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:
    import sdnotify
    sdnotify.SystemdNotifier(debug=True).notify("READY=1")
    print("ready via sdnotify", flush=True)
except ImportError:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"READY=1", "\0" + path[1:] if path[0] == "@" else path)
    print("ready via a raw datagram", flush=True)
while True:
    c, _ = ls.accept()
    with c:
        nodelay = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        c.recv(65536)
        body = ("version=py nodelay=%d pid=%d\n" % (nodelay, os.getpid())).encode()
        c.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

"""rcvbuf.py MODE SECONDS: TCP over loopback, a new connection every 50 ms. MODE "pin":
the client calls setsockopt(SO_RCVBUF, 65536) before connecting (pinning its receive
window); MODE "default": it leaves the buffer to autotuning. Ends by itself (at most 30 s)."""

import socket
import sys
import time

mode, secs = sys.argv[1], min(float(sys.argv[2]), 30.0)
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(8)
end = time.monotonic() + secs
print("ready", flush=True)
while time.monotonic() < end:
    client = socket.socket()
    if mode == "pin":
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    for _ in range(20):
        server.sendall(b"x" * 65536)
        got = 0
        while got < 65536:
            got += len(client.recv(65536))
    server.close()
    client.close()
    time.sleep(0.05)

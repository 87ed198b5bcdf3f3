"""Servers run inside a sandbox by the port tests (plain python3: the image has no extra packages)."""

# GET /count answers 1, 2, 3, ... from a counter that lives in the server's memory.
COUNTER = r"""
import http.server, socketserver, sys
count = 0
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        global count
        count += 1
        body = f"{count} {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
socketserver.TCPServer.allow_reuse_address = True
socketserver.TCPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
"""

# A WebSocket server (RFC 6455, unmasked replies) that echoes each text or binary message back.
WEBSOCKET_ECHO = r"""
import base64, hashlib, socket, struct, sys, threading
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data
def serve(conn):
    head = b""
    while b"\r\n\r\n" not in head:
        head += conn.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
    accept = base64.b64encode(hashlib.sha1(key + GUID.encode()).digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    try:
        while True:
            first, second = recv_exact(conn, 2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack("!H", recv_exact(conn, 2))[0]
            elif length == 127:
                length = struct.unpack("!Q", recv_exact(conn, 8))[0]
            mask = recv_exact(conn, 4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(recv_exact(conn, length)))
            opcode = first & 0x0F
            if opcode == 8:
                conn.sendall(b"\x88\x00")
                return
            size = bytes([len(data)]) if len(data) < 126 else b"\x7e" + struct.pack("!H", len(data))
            header = bytes([0x80 | opcode]) + size
            conn.sendall(header + data)
    except EOFError:
        pass
listener = socket.create_server(("0.0.0.0", int(sys.argv[1])), reuse_port=True)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

# Raw TCP: each line received is sent back upper-cased.
TCP_UPPER = r"""
import socket, sys, threading
def serve(conn):
    with conn, conn.makefile("rwb") as f:
        for line in f:
            f.write(line.upper())
            f.flush()
listener = socket.create_server(("0.0.0.0", int(sys.argv[1])), reuse_port=True)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

"""A test host's servers, run inside its network namespace by :mod:`tests.network.testhosts`.

python3 testhost_server.py http PORT NAME      GET / answers "hello from NAME"; /bytes/N sends N bytes;
                                               /desktop and /desktop/login: the desktop tests' page
python3 testhost_server.py dns PORT ZONE_JSON  answers A queries from {"name": "ip", "*.suffix": "ip"}
python3 testhost_server.py https PORT CERT LOG  HTTPS with CERT (chain and key); each request's Host, path,
                                               headers and body appended to LOG as a JSON line, never echoed
"""

from __future__ import annotations

import http.cookies
import http.server
import json
import secrets
import socket
import socketserver
import ssl
import sys
import threading

import dns.message
import dns.rcode
import dns.rrset

# The desktop's test page: its state as colour blocks a screenshot reads. Top left: blue, red once the button was
# clicked (kept in localStorage); top right: blue, green while the input holds "hello"; a strip below them: grey,
# green when the request carried the session cookie /desktop/login set (the server's own check). Bottom: the
# button (left half) and the input (right half).
DESKTOP_PAGE = """<!doctype html><html><head><title>stasis desktop test</title><style>
html, body { margin: 0; height: 100%; overflow: hidden; }
div, button, input { position: fixed; box-sizing: border-box; border: 0; margin: 0; font-size: 40px; }
#clicked { left: 0; top: 0; width: 50%; height: 45%; background: #0000ff; }
#typed { left: 50%; top: 0; width: 50%; height: 45%; background: #0000ff; }
#session { left: 0; top: 45%; width: 100%; height: 15%; background: SESSION; }
#button { left: 0; top: 60%; width: 50%; height: 40%; background: #ffff00; }
#input { left: 50%; top: 60%; width: 50%; height: 40%; background: #ffffff; outline: none; }
</style></head><body>
<div id="clicked"></div><div id="typed"></div><div id="session"></div>
<button id="button">click</button><input id="input">
<script>
const paint = () => {
  document.getElementById("clicked").style.background = localStorage.getItem("clicked") ? "#ff0000" : "#0000ff";
  document.getElementById("typed").style.background =
    document.getElementById("input").value === "hello" ? "#00ff00" : "#0000ff";
};
document.getElementById("button").onclick = () => { localStorage.setItem("clicked", "1"); paint(); };
document.getElementById("input").oninput = paint;
paint();
</script></body></html>"""
DESKTOP_SESSIONS: set[str] = set()  # the sessions /desktop/login gave out


def desktop_page(handler: http.server.BaseHTTPRequestHandler) -> None:
    """GET /desktop/login: a session cookie (a day long), then the page; GET /desktop: the page, its strip green
    only for a session this server gave out."""
    if handler.path == "/desktop/login":
        session = secrets.token_hex(16)
        DESKTOP_SESSIONS.add(session)
        handler.send_response(303)
        handler.send_header("set-cookie", f"desktop_session={session}; Max-Age=86400; Path=/; HttpOnly")
        handler.send_header("location", "/desktop")
        handler.send_header("content-length", "0")
        handler.end_headers()
        return
    cookies = http.cookies.SimpleCookie(handler.headers.get("cookie", ""))
    logged_in = "desktop_session" in cookies and cookies["desktop_session"].value in DESKTOP_SESSIONS
    page = DESKTOP_PAGE.replace("SESSION", "#00ff00" if logged_in else "#808080").encode()
    handler.send_response(200)
    handler.send_header("content-type", "text/html")
    handler.send_header("cache-control", "no-store")
    handler.send_header("content-length", str(len(page)))
    handler.end_headers()
    handler.wfile.write(page)


def send_bytes(handler: http.server.BaseHTTPRequestHandler, size: int) -> None:
    """GET /bytes/N: N bytes of "x"."""
    handler.send_response(200)
    handler.send_header("content-length", str(size))
    handler.end_headers()
    chunk = b"x" * (1 << 20)
    while size > 0:
        handler.wfile.write(chunk[: min(size, len(chunk))])
        size -= len(chunk)


def serve_http(port: int, name: str) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path.startswith("/bytes/"):
                send_bytes(self, int(self.path.rsplit("/", 1)[1]))
                return
            if self.path in ("/desktop", "/desktop/login"):
                desktop_page(self)
                return
            body = f"hello from {name} (Host: {self.headers.get('host')})".encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(socketserver.ThreadingTCPServer):  # not HTTPServer: its getfqdn() waits for DNS
        allow_reuse_address = True
        daemon_threads = True

    with Server(("0.0.0.0", port), Handler) as server:
        print("ready", flush=True)
        server.serve_forever()


def serve_https(port: int, cert: str, log: str) -> None:
    """What arrived is kept on this side (the test reads LOG); the answer never carries a header's value."""
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()  # a head and its body as they are written: no 40 ms of Nagle and delayed ACKs between
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _record(self, body: bytes) -> None:
            headers = [[k, v] for k, v in self.headers.items()]
            entry = {"method": self.command, "path": self.path, "host": self.headers.get("host"),
                     "headers": headers, "body": body.decode(errors="replace")}  # fmt: skip
            with lock, open(log, "a") as f:
                f.write(json.dumps(entry) + "\n")

        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.startswith("/bytes/"):
                send_bytes(self, int(self.path.rsplit("/", 1)[1]))
                return
            self._record(b"")
            self._answer(f"ok {self.command} {self.path}".encode())

        def do_POST(self) -> None:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                body = b""
                while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                    body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
            else:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path.startswith("/sink"):  # an upload: only its size is answered
                self._answer(str(len(body)).encode())
                return
            self._record(body)
            self._answer(f"ok {self.command} {self.path} {len(body)}".encode())

        def log_message(self, *args: object) -> None:
            pass

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert)
    with Server(("0.0.0.0", port), Handler) as server:
        server.socket = context.wrap_socket(server.socket, server_side=True)
        print("ready", flush=True)
        server.serve_forever()


def serve_dns(port: int, zone: dict[str, str]) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", port))
    print("ready", flush=True)
    while True:
        data, peer = sock.recvfrom(4096)
        query = dns.message.from_wire(data)
        reply = dns.message.make_response(query)
        name = query.question[0].name.to_text(omit_final_dot=True).lower()
        address = zone.get(name) or next((ip for key, ip in zone.items() if key.startswith("*.")
                                          and name.endswith(key[1:])), None)  # fmt: skip
        if address and query.question[0].rdtype == 1:
            reply.answer.append(dns.rrset.from_text(name + ".", 60, "IN", "A", address))
        elif not address:
            reply.set_rcode(dns.rcode.NXDOMAIN)
        sock.sendto(reply.to_wire(), peer)


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "http":
        serve_http(port, sys.argv[3])
    elif kind == "https":
        serve_https(port, sys.argv[3], sys.argv[4])
    else:
        serve_dns(port, json.loads(sys.argv[3]))

# The TLS origin of bench's inject section: HTTP/1.1 with keep-alive on 127.0.0.1, a
# certificate of the section's own CA; answers every GET with a small body saying
# whether the request carried an Authorization header.
import http.server
import ssl
import sys

cert, key, port = sys.argv[1], sys.argv[2], int(sys.argv[3])


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body go out in two writes: without TCP_NODELAY the second waits for the
    # client's delayed ACK (40 ms on Linux), which would be all any method measures.
    disable_nagle_algorithm = True

    def do_GET(self):
        body = b"auth" if self.headers.get("Authorization") else b"none"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self):
        super().server_bind()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.socket = ctx.wrap_socket(self.socket, server_side=True)


Server(("127.0.0.1", port), Handler).serve_forever()

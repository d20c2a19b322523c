# The client of bench's inject section: N requests on one kept-alive HTTPS connection
# (requests per second), then N/5 requests each on a new connection (median and p99
# milliseconds), through the proxy at 127.0.0.1:3128 (a CONNECT tunnel) or straight to
# 127.0.0.1:PORT. Prints one JSON object; fails if an answer is not 200 or if the
# Authorization seen by the origin is not what is expected.
import http.client
import json
import ssl
import statistics
import sys
import time

mode, host, port, cafile, n, want = sys.argv[1:7]
port, n = int(port), int(n)
ctx = ssl.create_default_context(cafile=cafile)


def connect():
    if mode == "proxy":
        c = http.client.HTTPSConnection("127.0.0.1", 3128, context=ctx, timeout=30)
        c.set_tunnel(host, port)
    else:
        c = http.client.HTTPSConnection(host, port, context=ctx, timeout=30)
    return c


def get(c):
    c.request("GET", "/", headers={"Host": f"{host}:{port}"})
    r = c.getresponse()
    body = r.read()
    if r.status != 200 or body.decode() != want:
        raise SystemExit(f"unexpected answer {r.status} {body!r} (wanted {want})")


c = connect()
get(c)
t = time.perf_counter()
for _ in range(n):
    get(c)
rps = n / (time.perf_counter() - t)
c.close()
lat = []
for _ in range(max(n // 5, 1)):
    t = time.perf_counter()
    c = connect()
    get(c)
    lat.append((time.perf_counter() - t) * 1e3)
    c.close()
lat.sort()
print(json.dumps({"rps": rps, "new_ms": statistics.median(lat),
                  "new_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))]}))

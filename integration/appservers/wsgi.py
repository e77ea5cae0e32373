# A WSGI app for gunicorn under deployd (integration/appservers_test.go and
# the compatibility harness). WSGI_APP_MODE=broken fails at import; slow
# imports 2 s late.
import os
import time

mode = os.environ.get("WSGI_APP_MODE", "")
if mode == "broken":
    raise RuntimeError("import failed: WSGI_APP_MODE=broken")
if mode == "slow":
    time.sleep(2)

BODY = ("version=%s pid=%d slot=%s\n" % (
    os.environ.get("APP_VERSION", ""), os.getpid(), os.environ.get("DEPLOYD_WORKER", ""))).encode()


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
    return [BODY]

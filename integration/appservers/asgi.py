# An ASGI app for uvicorn, alone or as gunicorn's worker class, under
# deployd (the compatibility harness, integration/compat).
import os

BODY = ("version=%s pid=%d slot=%s\n" % (
    os.environ.get("APP_VERSION", ""), os.getpid(), os.environ.get("DEPLOYD_WORKER", ""))).encode()


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})

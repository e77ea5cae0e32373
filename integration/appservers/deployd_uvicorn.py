"""A drain for uvicorn that loses no request, alone or as gunicorn's UvicornWorker.

uvicorn's shutdown (0.17 to 0.35 at least) closes idle keep-alive connections,
and accepted ones whose request it has not read yet, at once: a client whose
next request crosses the close gets a reset. With this module, the stop signal
makes uvicorn stop accepting (the other workers take the queued connections),
every later response says "Connection: close", and uvicorn's own shutdown runs
once each connection closed after that response, or after uvicorn's keep-alive
timeout (then it closes the connections that sent nothing and waits for the
requests in flight). Use it in the module that defines the app:

    import deployd_uvicorn
    app = deployd_uvicorn.drain(app)
"""
import asyncio

import uvicorn.server

_draining = False
_uvicorn_shutdown = uvicorn.server.Server.shutdown


async def _drain_then_shutdown(self, sockets=None):
    global _draining
    _draining = True
    for server in self.servers:
        server.close()  # stop accepting
    await asyncio.sleep(0.1)  # connections accepted just before reach server_state
    # A connection closes after its next response; one that sends nothing
    # more closes at the keep-alive timeout, when uvicorn's shutdown closes
    # those that never sent a request and waits for the requests in flight.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + self.config.timeout_keep_alive
    while self.server_state.connections and not self.force_exit and loop.time() < deadline:
        await asyncio.sleep(0.1)
    await _uvicorn_shutdown(self, sockets)


uvicorn.server.Server.shutdown = _drain_then_shutdown


def drain(app):
    """Wraps an ASGI app: once draining, every response says Connection: close."""

    async def draining_app(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def send_close(message):
            if _draining and message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        return await app(scope, receive, send_close)

    return draining_app

# The harness's ASGI app (asgi.py) with deployd_uvicorn's drain.
import deployd_uvicorn
from asgi import app

app = deployd_uvicorn.drain(app)

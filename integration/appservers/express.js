// An unmodified Express app, as its tutorial writes it (listen on a port),
// for the compatibility harness (integration/compat): deployd's Node.js
// integration maps the listen onto the inherited socket.
const express = require('express')
const app = express()
const body = `version=${process.env.APP_VERSION} pid=${process.pid} slot=${process.env.DEPLOYD_WORKER}\n`
app.get('/', (req, res) => res.type('text/plain').send(body))
app.listen(3000, () => console.log('Example app listening on port 3000'))

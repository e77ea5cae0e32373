// Bun.serve as Bun's docs write it: it binds its own port, no signal code.
// Its answer names its version, pid and slot as the load generator expects.
const body = `version=${process.env.APP_VERSION} pid=${process.pid} slot=${process.env.DEPLOYD_WORKER}\n`;
Bun.serve({
  port: Number(process.env.PORT),
  fetch() {
    return new Response(body);
  },
});
console.log(`listening on :${process.env.PORT}`);

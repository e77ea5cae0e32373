// Deno.serve as Deno's docs write it: it binds its own port, no signal code.
// Its answer names its version, pid and slot as the load generator expects.
const body = `version=${Deno.env.get("APP_VERSION")} pid=${Deno.pid} slot=${Deno.env.get("DEPLOYD_WORKER")}\n`;
Deno.serve({ port: Number(Deno.env.get("PORT")) }, () => new Response(body));

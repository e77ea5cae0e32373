// Lists the PM2 daemon's processes (PM2_HOME) through pm2's API every 5 ms and prints
// [{pm_id, pid, pm2_env: {status}}] as one JSON line whenever it changes. Used by deployd's
// benchmark to time crash recovery: `pm2 jlist` costs a Node start per look.
// Usage: node pm2poll.js PATH_OF_PM2_PACKAGE. Exits when stdin closes.
'use strict';
const pm2 = require(process.argv[2]);

let last = '';
function tick() {
  pm2.list((err, list) => {
    if (err) {
      console.error(`pm2 list: ${err}`);
      process.exit(1);
    }
    const s = JSON.stringify(list.map((p) => ({
      pm_id: p.pm_id, pid: p.pid, pm2_env: { status: p.pm2_env.status },
    })));
    if (s !== last) {
      last = s;
      process.stdout.write(s + '\n');
    }
    setTimeout(tick, 5);
  });
}

// Connects to the daemon of PM2_HOME (already running: the harness started it).
pm2.connect((err) => {
  if (err) {
    console.error(`pm2 connect: ${err}`);
    process.exit(1);
  }
  tick();
});
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();

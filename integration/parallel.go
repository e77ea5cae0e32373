package integration

// The slowest tests here spend most of their time waiting on processes
// and timers (Node.js and Python start-ups, a crash loop's backoff, a
// canary's timeout, ansible-playbook's forks), not on the CPU. They call
// t.Parallel(), so that go test runs them GOMAXPROCS at a time after the
// other tests: the package stays well inside go test's default 10-minute
// timeout on CI's 2 cores. Each has its own agent, folder and ports
// (FreePort), and none uses t.Setenv. A test that measures the agent's
// own resources (fds, RSS, timings) stays serial.

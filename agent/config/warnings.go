package config

import "strconv"

// warnings are notes about a valid config that probably does not do what
// its author means. `deployd config check` prints them and the agent logs
// them at start; they change nothing.
func warnings(c *Config, file string, kl keyLines) []Problem {
	var out []Problem
	for _, n := range c.AppNames {
		a := c.Apps[n]
		if p := healthWarning(a, file, kl); p != nil {
			out = append(out, *p)
		}
		if len(a.Listen) == 0 && a.Ready.Mode == ReadyLog {
			key := []string{"apps", n, "ready"}
			out = append(out, Problem{File: file, Line: kl.find(key), Key: keyString(key), Value: strconv.Quote(a.Ready.Raw),
				Msg: "the app has no listen, and its readiness is a log line: a worker counts as ready when the line " +
					"appears, whether or not anything serves its port; add listen = [\"tcp://HOST:PORT\"] so that the agent " +
					"opens the socket and hands it to the workers, or ignore this if the app serves no port"})
		}
	}
	out = append(out, canaryWarnings(c, file, kl)...)
	return out
}

// canaryWarnings: canary_action without canary_timeout does nothing.
func canaryWarnings(c *Config, file string, kl keyLines) []Problem {
	var out []Problem
	for _, n := range c.AppNames {
		a := c.Apps[n]
		key := []string{"apps", n, "canary_action"}
		if a.CanaryTimeout == 0 && a.CanaryAction != "abort" {
			out = append(out, Problem{File: file, Line: kl.find(key), Key: keyString(key), Value: strconv.Quote(a.CanaryAction),
				Msg: "canary_action applies when canary_timeout ends a hold, and canary_timeout is not set (a hold lasts until " +
					"`deployd promote` or `deployd abort`); add canary_timeout = \"15m\" or remove canary_action"})
		}
	}
	return out
}

package config

import (
	"fmt"
	"strconv"
)

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
	out = append(out, rootAppWarnings(c, file, kl)...)
	out = append(out, limitWarnings(c, file, kl)...)
	return out
}

// rootAppWarnings: with socket_group, an app without user runs as root
// under a root agent, so the agent refuses members' deploys and other
// changes to it unless members_may_run_as_root is set; and with that key,
// members can run any code as root.
func rootAppWarnings(c *Config, file string, kl keyLines) []Problem {
	g := c.Agent.SocketGroup
	if g == "" {
		return nil
	}
	var out []Problem
	for _, n := range c.AppNames {
		a := c.Apps[n]
		if a.User != "" && a.User != "root" && a.User != "0" {
			continue
		}
		key := []string{"apps", n, "user"}
		msg := fmt.Sprintf("the app runs as root under an agent that runs as root (no user, or user root): the agent "+
			"refuses deploy, rollback, reload, restart, scale, stop, start, promote and abort of it by members of "+
			"socket_group %q; set user = \"NAME\" to run it as an unprivileged user, or members_may_run_as_root = true "+
			"if members may run code as root", g)
		if a.MembersMayRunAsRoot {
			key = []string{"apps", n, "members_may_run_as_root"}
			msg = fmt.Sprintf("members of socket_group %q can run any code as root through this app (a deploy runs their "+
				"release and its hooks as root) when the agent runs as root; set user = \"NAME\" to run it as an "+
				"unprivileged user instead", g)
		}
		out = append(out, Problem{File: file, Line: kl.find(key), Key: keyString(key), Msg: msg})
	}
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

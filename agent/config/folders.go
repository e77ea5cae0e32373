package config

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/deployd/deployd/internal/safeopen"
)

// checkFolders refuses a state_dir, log_dir, env_file or unix listener
// folder that an app's user, a member or any user but root and the agent's
// can change (safeopen.Trust.CheckFolder): whoever can rename or create
// entries on such a path could swap a log, a state file, an env_file or
// the folder root binds a socket in for a link to where only root may
// read or write. It runs once the whole config is decoded, because the
// groups that may not write depend on every app.
func (d *decoder) checkFolders(c *Config) {
	t := safeopen.Trust{UID: d.env.euid, GID: os.Getegid(), Untrusted: untrustedGroups(c)}
	c.trust = t
	if d.env.checkFolder == nil {
		return
	}
	folder := func(key []string, value, dir, fix string) {
		if err := d.env.checkFolder(t, dir); err != nil {
			d.fail(key, strconv.Quote(value), hint(err, "%v, or %s", err, fix))
		}
	}
	folder(agentKey("state_dir"), c.Agent.StateDir, c.Agent.StateDir, "use a state_dir only root can write (the default /var/lib/deployd)")
	folder(agentKey("log_dir"), c.Agent.LogDir, c.Agent.LogDir, "use a log_dir only root can write (the default /var/log/deployd)")
	for _, name := range c.AppNames {
		if f := c.Apps[name].EnvFile; f != "" {
			folder([]string{"apps", name, "env_file"}, f, filepath.Dir(f), "keep the env_file in a folder only root can write (e.g. /etc/deployd)")
		}
		for _, l := range c.Apps[name].Listen {
			if l.Network == "unix" {
				folder([]string{"apps", name, "listen"}, l.URL, filepath.Dir(l.Address), safeopen.SocketFolderFix)
			}
		}
	}
}

// CheckSocketFolder checks the folders above a unix listener's socket path
// as the config check did (checkFolders), with the groups of this config's
// apps and socket_group: the agent runs it again right before it binds the
// socket (handoff.Want.CheckFolder), since a folder may change after the
// config loaded. The error wraps a *safeopen.UnsafeFolderError.
func (c *Config) CheckSocketFolder(dir string) error {
	if err := c.trust.CheckFolder(dir); err != nil {
		return fmt.Errorf("%w, or %s", err, safeopen.SocketFolderFix)
	}
	return nil
}

// untrustedGroups names the groups that may not write a folder holding
// what root reads: socket_group, each app's group, and every group of each
// app's user.
func untrustedGroups(c *Config) func(gid uint32) string {
	why := map[uint32]string{}
	add := func(gid, reason string) {
		if n, err := strconv.ParseUint(gid, 10, 32); err == nil && n != 0 {
			if _, seen := why[uint32(n)]; !seen {
				why[uint32(n)] = fmt.Sprintf("gid %d, %s", n, reason)
			}
		}
	}
	if g := lookupGroup(c.Agent.SocketGroup); g != nil {
		add(g.Gid, "socket_group")
	}
	for _, name := range c.AppNames {
		app := c.Apps[name]
		if g := lookupGroup(app.Group); g != nil {
			add(g.Gid, "the group of app "+name)
		}
		u := lookupUser(app.User)
		if u == nil {
			continue
		}
		add(u.Gid, "a group of app "+name+"'s user")
		if gids, err := u.GroupIds(); err == nil {
			for _, gid := range gids {
				add(gid, "a group of app "+name+"'s user")
			}
		}
	}
	return func(gid uint32) string { return why[gid] }
}

// lookupGroup finds a group by name or id; nil for "" or none.
func lookupGroup(name string) *user.Group {
	if name == "" {
		return nil
	}
	if g, err := user.LookupGroup(name); err == nil {
		return g
	}
	if g, err := user.LookupGroupId(name); err == nil {
		return g
	}
	return nil
}

// lookupUser finds a user by name or id; nil for "" or none.
func lookupUser(name string) *user.User {
	if name == "" {
		return nil
	}
	if u, err := user.Lookup(name); err == nil {
		return u
	}
	if u, err := user.LookupId(name); err == nil {
		return u
	}
	return nil
}

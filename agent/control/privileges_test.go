package control

import (
	"os"
	"strings"
	"testing"

	"github.com/deployd/deployd/agent/config"
)

// memberColumn is how the docs' tables word each Need.
var memberColumn = map[Need]string{
	NeedMember:       "yes",
	NeedMemberSigned: "only with `--binary` signed for `upgrade_public_key`",
	NeedOwner:        "no",
}

// The privilege table in code, docs/commands.md's and SECURITY.md's agree, and every
// route of the control server has exactly one row.
func TestPrivilegeTablesAgree(t *testing.T) {
	s := &Server{}
	hs := s.handlers()
	seen := map[string]bool{}
	for _, p := range Privileges {
		key := p.Method + " " + p.Path
		if seen[key] {
			t.Errorf("%s has two rows", key)
		}
		seen[key] = true
		if hs[key] == nil {
			t.Errorf("%s is in Privileges but has no handler", key)
		}
	}
	for key := range hs {
		if !seen[key] {
			t.Errorf("route %s has no row in Privileges: every call needs one", key)
		}
	}
	for _, doc := range []string{"../../docs/commands.md", "../../SECURITY.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rows := 0
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "| `GET /v1/") || strings.HasPrefix(line, "| `POST /v1/") {
				rows++
			}
		}
		if rows != len(Privileges) {
			t.Errorf("%s has %d rows of calls, the code %d", doc, rows, len(Privileges))
		}
		for _, p := range Privileges {
			cells := rowOf(string(b), p.Method+" "+p.Path)
			if len(cells) != 4 || cells[2] != "yes" || cells[3] != memberColumn[p.Need] {
				t.Errorf("%s: row of %s %s is %q; want owner yes, member %q", doc, p.Method, p.Path, cells, memberColumn[p.Need])
			}
		}
	}
}

// rowOf returns the cells of the table row for call in doc.
func rowOf(doc, call string) []string {
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "| `"+call+"` |") {
			var cells []string
			for _, c := range strings.Split(strings.Trim(line, "|"), " | ") {
				cells = append(cells, strings.TrimSpace(c))
			}
			return cells
		}
	}
	return nil
}

func TestAuthorize(t *testing.T) {
	s := &Server{}
	for _, tc := range []struct {
		role   Role
		method string
		path   string
		ok     bool
	}{
		{RoleOwner, "POST", "/v1/shutdown", true},
		{RoleMember, "POST", "/v1/shutdown", false},
		{RoleMember, "POST", "/v1/deploy", true},
		{RoleMember, "POST", "/v1/upgrade", true}, // the upgrade then requires a signature
		{RoleMember, "POST", "/v1/unknown", false},
	} {
		ok, why := s.authorize(&Peer{UID: 1234, Role: tc.role}, tc.method, tc.path)
		if ok != tc.ok {
			t.Errorf("%s %s %s: %v (%s), want %v", tc.role, tc.method, tc.path, ok, why, tc.ok)
		}
	}
}

// A member may not change an app that runs as root (the agent runs as
// root, the app has no user) unless the app says members_may_run_as_root;
// owners always may, and reading is never refused.
func TestMemberMayNotChangeRootApp(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("an app runs as root only under a root agent")
	}
	member := &Peer{UID: 1234, Role: RoleMember}
	owner := &Peer{UID: 0, Role: RoleOwner}
	for _, tc := range []struct {
		name string
		p    *Peer
		app  config.App
		ok   bool
	}{
		{"member, no user", member, config.App{Name: "web"}, false},
		{"member, user root", member, config.App{Name: "web", User: "root"}, false},
		{"member, no user, key set", member, config.App{Name: "web", MembersMayRunAsRoot: true}, true},
		{"member, user nobody", member, config.App{Name: "web", User: "nobody"}, true},
		{"owner, no user", owner, config.App{Name: "web"}, true},
	} {
		ok, why := mayChange(tc.p, &tc.app)
		if ok != tc.ok {
			t.Errorf("%s: %v (%s), want %v", tc.name, ok, why, tc.ok)
		}
		if !ok && (!strings.Contains(why, "members_may_run_as_root = true") || !strings.Contains(why, "runs as root")) {
			t.Errorf("%s: the refusal does not name the key: %s", tc.name, why)
		}
	}
	for call := range changesApp {
		method, path, _ := strings.Cut(call, " ")
		if need, ok := needOf(method, path); !ok || need != NeedMember {
			t.Errorf("%s: changesApp lists a call members may not make at all", call)
		}
	}
}

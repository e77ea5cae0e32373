package procunit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// v1Dir is the folder of the agent's own cgroup in the cgroup v1
// hierarchy of controller c (a hybrid host: /sys/fs/cgroup/memory/...):
// its "N:c,...:PATH" line of /proc/self/cgroup under the mount whose
// super options name c.
func v1Dir(c string) (string, error) {
	b, err := readBounded("/proc/self/cgroup", 64<<10)
	if err != nil {
		return "", fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	own := ""
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slicesContains(strings.Split(parts[1], ","), c) {
			own = parts[2]
		}
	}
	if own == "" {
		return "", fmt.Errorf("no cgroup v1 hierarchy has the %s controller", c)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slicesIndex(fields, "-")
		if sep < 5 || sep+3 >= len(fields) || fields[sep+1] != "cgroup" ||
			!slicesContains(strings.Split(fields[sep+3], ","), c) {
			continue
		}
		root, mnt := fields[3], fields[4]
		rel, ok := strings.CutPrefix(own, root)
		if !ok {
			continue
		}
		return filepath.Join(mnt, rel), nil
	}
	return "", fmt.Errorf("the %s controller's cgroup v1 hierarchy is not mounted here", c)
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// v1Cgroup is the unit's cgroup in controller c's cgroup v1 hierarchy,
// made on first use: a sibling of the unit's cgroup v2 folder by name.
func (u *Unit) v1Cgroup(c string) (string, error) {
	if dir, ok := u.v1[c]; ok {
		return dir, nil
	}
	base, err := v1Dir(c)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(base, "deployd-"+u.name+"-"+u.id[:8])
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("procunit: make cgroup v1 %s: %w", dir, err)
	}
	if u.v1 == nil {
		u.v1 = map[string]string{}
	}
	u.v1[c] = dir
	return dir, nil
}

// Join moves process pid (the unit's command, just started: before it
// can start another) into the unit's cgroup v1 folders; cgroup v1 has no
// clone into a cgroup.
func (u *Unit) Join(pid int) error {
	var errs []error
	for _, dir := range u.v1 {
		errs = append(errs, writeFile(dir, "cgroup.procs", strconv.Itoa(pid)))
	}
	return errors.Join(errs...)
}

// removeV1 removes the unit's cgroup v1 folders once their processes
// are gone (reaped), waiting at most removeGrace.
func (u *Unit) removeV1(ctx context.Context) error {
	deadline := time.Now().Add(removeGrace)
	var errs []error
	for c, dir := range u.v1 {
		for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				delete(u.v1, c)
				break
			}
			if !errors.Is(err, unix.EBUSY) || ctx.Err() != nil || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("procunit: remove cgroup %s: %w", dir, err))
				break
			}
			time.Sleep(wait) // cgroup v1 has no populated event to wait on
		}
	}
	return errors.Join(errs...)
}

// v1Unit reports whether dir is one of the unit id's cgroup v1 folders.
func v1Unit(dir, id string) bool {
	return unitsCgroup(dir, id) && strings.HasPrefix(dir, "/sys/fs/cgroup/")
}

// DropV1 removes the unit's cgroup v1 folders made for a command that did
// not start.
func (u *Unit) DropV1() {
	for c, dir := range u.v1 {
		_ = os.Remove(dir)
		delete(u.v1, c)
	}
}

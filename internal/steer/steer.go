// Package steer chooses, in the kernel, which worker's socket gets each new
// connection of an address: every worker listens on a socket of its own in
// one SO_REUSEPORT group, and a BPF program of type sk_reuseport picks one
// from a REUSEPORT_SOCKARRAY map the agent keeps in step with the pool — in
// turn (Even) or by the client's IP address (Sticky). The program is attached as BPF_SK_REUSEPORT_SELECT_OR_MIGRATE,
// so the kernel also asks it where the queued connections of a socket that
// closes go (request migration, Linux 5.14): a worker that stops, drains or
// crashes hands them to another instead of resetting them. The map has a
// standby half beside the live one, so that a whole new generation of
// sockets can be switched in by one update (Stage, Flip). The agent is
// never on the data path.
//
// The program is written with cilium/ebpf's asm package, so building needs
// no C compiler. It follows the kernel selftests prog_tests/migrate_reuseport.c
// and progs/test_migrate_reuseport.c.
package steer

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Mode is how the program picks a worker.
type Mode uint32

// Modes.
const (
	// Even gives the slots a connection in turn. (A 4-tuple hash spreads
	// many short connections as well, but a few long ones unevenly: 8
	// keep-alive connections hashed over 8 workers leave some idle.)
	Even Mode = 0
	// Sticky sends every connection of a client IP address to the same
	// worker while it lives; when it goes, its clients move together to one
	// other worker (the next live slot).
	Sticky Mode = 1
)

// String names the mode as the config does.
func (m Mode) String() string {
	if m == Sticky {
		return "sticky"
	}
	return "even"
}

// MaxSlots bounds a group's slots (workers and spares); Hold is the map
// index of the socket that keeps connections while the group is held.
// The socket map has two halves of MaxSlots, on either side of Hold: the
// live one, which the program picks from, and a standby one, where Stage
// puts the sockets of a whole new generation that Flip then makes live in
// one update (an atomic cutover).
const (
	MaxSlots = 256
	Hold     = MaxSlots
	// secondHalf is where the second half starts.
	secondHalf = MaxSlots + 1
)

// ErrUnavailable wraps every reason steering cannot work here (no BPF, no
// privilege, an old kernel): the caller falls back to one shared socket.
var ErrUnavailable = errors.New("steer: kernel steering unavailable")

// config is the program's configuration, one entry of an array map.
type config struct {
	Active uint32 // slots 0..Active-1 take connections; the rest are spares
	Mode   uint32
	Held   uint32 // 1: every new connection goes to the Hold socket
	Next   uint32 // the arrival counter Even takes turns by
}

// Group is the program and maps of one address's reuseport group. Its
// methods are a syscall or two on kernel objects and safe for concurrent
// use; the caller keeps the configuration consistent (one owner: a Set or
// Stage racing a Flip may land in either half).
type Group struct {
	prog   *ebpf.Program
	socks  *ebpf.Map // REUSEPORT_SOCKARRAY: half + slot → socket
	cfg    *ebpf.Map // ARRAY of one config
	counts *ebpf.Map // ARRAY: slot → connections given to it
	// base is an ARRAY of one uint32, the first index of the live half
	// (0 or secondHalf); nil for a program taken over from an agent that
	// had one half only (FromFile), which cannot Flip. live caches it.
	base *ebpf.Map
	live atomic.Uint32
}

// New loads a program and its maps in mode m, with no slot active. An
// error wraps ErrUnavailable when the kernel or the privileges do not allow
// it.
func New(m Mode) (*Group, error) {
	g := &Group{}
	specs := []struct {
		m    **ebpf.Map
		spec ebpf.MapSpec
		what string
	}{
		{&g.socks, ebpf.MapSpec{Name: "deployd_socks", Type: ebpf.ReusePortSockArray,
			KeySize: 4, ValueSize: 8, MaxEntries: secondHalf + MaxSlots}, "socket"},
		{&g.cfg, ebpf.MapSpec{Name: "deployd_steer", Type: ebpf.Array, KeySize: 4, ValueSize: 16, MaxEntries: 1}, "config"},
		{&g.counts, ebpf.MapSpec{Name: "deployd_counts", Type: ebpf.Array,
			KeySize: 4, ValueSize: 8, MaxEntries: MaxSlots + 1}, "counter"},
		// Its own map, so that a previous agent's code, which looks for
		// the three above by type and size, still finds them.
		{&g.base, ebpf.MapSpec{Name: "deployd_base", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1}, "half"},
	}
	for _, ms := range specs {
		m, err := ebpf.NewMap(&ms.spec)
		if err != nil {
			g.Close()
			return nil, unavailable("create the "+ms.what+" map", err)
		}
		*ms.m = m
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "deployd_steer", Type: ebpf.SkReuseport,
		AttachType: ebpf.AttachSkReuseportSelectOrMigrate, License: "GPL",
		Instructions: program(g.socks, g.cfg, g.counts, g.base)})
	if err != nil {
		g.Close()
		return nil, unavailable("load the sk_reuseport program", err)
	}
	g.prog = prog
	if err := g.write(func(c *config) { c.Mode = uint32(m) }); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

func unavailable(what string, err error) error {
	hint := ""
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		hint = " (the agent needs root or CAP_BPF and CAP_NET_ADMIN)"
	} else if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) {
		hint = " (the kernel needs sk_reuseport programs with request migration, Linux 5.14 or later)"
	}
	return fmt.Errorf("%w: %s%s: %w", ErrUnavailable, what, hint, err)
}

// Available reports whether steering works here: nil, or why not (wrapping
// ErrUnavailable).
func Available() error {
	g, err := New(Even)
	if err != nil {
		return err
	}
	g.Close()
	return nil
}

// write changes the configuration.
func (g *Group) write(change func(*config)) error {
	var c config
	if err := g.cfg.Lookup(uint32(0), &c); err != nil {
		return fmt.Errorf("steer: read config: %w", err)
	}
	change(&c)
	if err := g.cfg.Put(uint32(0), &c); err != nil {
		return fmt.Errorf("steer: write config: %w", err)
	}
	return nil
}

// SetMode switches between Even and Sticky for the next connections.
func (g *Group) SetMode(m Mode) error { return g.write(func(c *config) { c.Mode = uint32(m) }) }

// SetActive makes slots 0..n-1 take connections; sockets in slots n and up
// get none (spares, or workers past a shrink).
func (g *Group) SetActive(n int) error {
	if n < 0 || n > MaxSlots {
		return fmt.Errorf("steer: %d slots; at most %d", n, MaxSlots)
	}
	return g.write(func(c *config) { c.Active = uint32(n) })
}

// Set puts the listening socket fd in slot of the live half (replacing,
// in one step, the one there), or in Hold. The map does not keep the
// socket open: it leaves the map when its last descriptor closes. A socket
// is in one place of the map at most (the kernel refuses a second).
func (g *Group) Set(slot int, fd uintptr) error {
	if slot == Hold {
		return g.put(Hold, fd)
	}
	if slot < 0 || slot >= MaxSlots {
		return fmt.Errorf("steer: slot %d out of range 0..%d", slot, MaxSlots-1)
	}
	return g.put(g.live.Load()+uint32(slot), fd)
}

// Stage puts the listening socket fd in slot of the standby half, where
// the program does not look until Flip: the socket is in the group but
// gets no connection. ErrNoStandby without one (CanFlip).
func (g *Group) Stage(slot int, fd uintptr) error {
	if !g.CanFlip() {
		return ErrNoStandby
	}
	if slot < 0 || slot >= MaxSlots {
		return fmt.Errorf("steer: slot %d out of range 0..%d", slot, MaxSlots-1)
	}
	return g.put(g.standby()+uint32(slot), fd)
}

// Unstage empties slot of the standby half (a Stage that is not to be
// flipped in: the socket may then go in the live half).
func (g *Group) Unstage(slot int) error {
	if !g.CanFlip() || slot < 0 || slot >= MaxSlots {
		return nil
	}
	err := g.socks.Delete(g.standby() + uint32(slot))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("steer: unstage slot %d: %w", slot, err)
	}
	return nil
}

// ErrNoStandby: the group's program came from an agent whose map had one
// half only (taken over by FromFile), so it cannot switch a generation in
// at once.
var ErrNoStandby = errors.New("steer: this steering program has no standby half (loaded by an older agent); a generation can only be switched in slot by slot until the app's listener is opened anew (remove the app from the config, reload, add it again)")

// CanFlip reports whether the group has a standby half (Stage, Flip).
func (g *Group) CanFlip() bool { return g.base != nil }

func (g *Group) standby() uint32 {
	if g.live.Load() == 0 {
		return secondHalf
	}
	return 0
}

func (g *Group) put(index uint32, fd uintptr) error {
	if err := g.socks.Put(index, uint64(fd)); err != nil {
		return fmt.Errorf("steer: put socket in map index %d: %w", index, err)
	}
	return nil
}

// Flip makes the standby half live, in one map update: every new
// connection from then on goes to the sockets Stage put there, none to
// those of the half that was live (its sockets stay in the map, taking no
// connection, until they close; a closing one's queued connections move
// to the live half). Set then writes to the new live half.
func (g *Group) Flip() error {
	if !g.CanFlip() {
		return ErrNoStandby
	}
	next := g.standby()
	if err := g.base.Put(uint32(0), next); err != nil {
		return fmt.Errorf("steer: switch halves: %w", err)
	}
	g.live.Store(next)
	return nil
}

// Clear empties slot in both halves; an empty slot is skipped.
func (g *Group) Clear(slot int) error {
	if slot < 0 || slot >= MaxSlots {
		return fmt.Errorf("steer: slot %d out of range 0..%d", slot, MaxSlots-1)
	}
	for _, i := range []uint32{uint32(slot), secondHalf + uint32(slot)} {
		if i >= g.socks.MaxEntries() {
			continue
		}
		if err := g.socks.Delete(i); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("steer: clear slot %d: %w", slot, err)
		}
	}
	return nil
}

// Hold sends every new connection to the listening socket fd, which nobody
// accepts on: they wait in its accept queue. Unhold (then closing that
// socket) moves them on.
func (g *Group) Hold(fd uintptr) error {
	if err := g.Set(Hold, fd); err != nil {
		return err
	}
	return g.write(func(c *config) { c.Held = 1 })
}

// Unhold sends new connections to the slots again. The hold socket's
// queue moves to the workers when it is closed (request migration).
func (g *Group) Unhold() error {
	if err := g.write(func(c *config) { c.Held = 0 }); err != nil {
		return err
	}
	if err := g.socks.Delete(uint32(Hold)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("steer: clear the hold socket: %w", err)
	}
	return nil
}

// Attach attaches the program to the reuseport group of the listening
// socket fd (bound with SO_REUSEPORT).
func (g *Group) Attach(fd uintptr) error {
	if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, g.prog.FD()); err != nil {
		return fmt.Errorf("steer: attach program: %w", err)
	}
	return nil
}

// File returns a copy of the program's descriptor, for the next agent
// (FromFile); the caller closes it.
func (g *Group) File() (*os.File, error) {
	fd, err := unix.FcntlInt(uintptr(g.prog.FD()), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("steer: dup program: %w", err)
	}
	return os.NewFile(uintptr(fd), "deployd-steer-program"), nil
}

// FromFile takes over the group whose program f holds (from File, passed
// on by a previous agent); its maps are found through the program. f is
// not closed.
func FromFile(f *os.File) (*Group, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("steer: dup program: %w", err)
	}
	prog, err := ebpf.NewProgramFromFD(fd)
	if err != nil {
		unix.Close(fd)
		return nil, unavailable("take the program over", err)
	}
	g := &Group{prog: prog}
	if err := g.findMaps(); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

func (g *Group) findMaps() error {
	info, err := g.prog.Info()
	if err != nil {
		return unavailable("read the program's info", err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		return fmt.Errorf("%w: the kernel does not name a program's maps", ErrUnavailable)
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			return unavailable("open the program's map", err)
		}
		switch {
		case m.Type() == ebpf.ReusePortSockArray && g.socks == nil:
			g.socks = m
		case m.Type() == ebpf.Array && m.ValueSize() == 16 && g.cfg == nil:
			g.cfg = m
		case m.Type() == ebpf.Array && m.ValueSize() == 8 && g.counts == nil:
			g.counts = m
		case m.Type() == ebpf.Array && m.ValueSize() == 4 && g.base == nil:
			g.base = m
		default:
			m.Close()
		}
	}
	if g.socks == nil || g.cfg == nil || g.counts == nil {
		return errors.New("steer: the program passed on is not deployd's: its maps are missing")
	}
	if g.base != nil {
		var live uint32
		if err := g.base.Lookup(uint32(0), &live); err != nil {
			return fmt.Errorf("steer: read the live half: %w", err)
		}
		g.live.Store(live)
	}
	return nil
}

// Count returns how many connections the program has given to slot so
// far (it never resets; compare two readings).
func (g *Group) Count(slot int) (uint64, error) {
	var n uint64
	if err := g.counts.Lookup(uint32(slot), &n); err != nil {
		return 0, fmt.Errorf("steer: read the count of slot %d: %w", slot, err)
	}
	return n, nil
}

// Mode returns the mode in effect.
func (g *Group) Mode() (Mode, error) {
	var c config
	if err := g.cfg.Lookup(uint32(0), &c); err != nil {
		return Even, fmt.Errorf("steer: read config: %w", err)
	}
	return Mode(c.Mode), nil
}

// Close closes the agent's handles; a group's sockets keep the program
// attached until the last of them closes. Safe to call twice.
func (g *Group) Close() error {
	var errs []error
	if g.prog != nil {
		errs = append(errs, g.prog.Close())
	}
	for _, m := range []*ebpf.Map{g.socks, g.cfg, g.counts, g.base} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

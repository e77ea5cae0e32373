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
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
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

// ethIPv4 is ETH_P_IP as the program reads sk_reuseport_md.eth_protocol
// (network byte order in a host-order word).
var ethIPv4 = int32(binary.NativeEndian.Uint16([]byte{0x08, 0x00}))

// Offsets in struct sk_reuseport_md (include/uapi/linux/bpf.h).
const (
	mdEthProtocol = 20
	mdHash        = 32
	mdMigratingSk = 48 // struct bpf_sock *, NULL unless migrating
)

// Offsets in struct bpf_sock (include/uapi/linux/bpf.h): for a migrating
// connection the "destination" is its client.
const (
	bsFamily  = 4
	bsDstIP4  = 52
	bsDstIP6w = 56 + 12 // the last word of dst_ip6
)

// program picks the socket of a new (or migrating) connection:
//
//	held:   the Hold socket, if there is one
//	even:   slot = arrivals % active (turns, in arrival order)
//	sticky: slot = mix(client IPv4, or the last word of an IPv6) % active,
//	        the client's address read from the packet or, for a connection
//	        migrating off a closed socket (no packet), from that connection
//	then the first live slot from there on (a crashed worker's socket has
//	left the map: its clients all go to the next one), in the live half
//	(the base map's index, 0 without one).
//
// No live slot: SK_PASS without a choice, the kernel's own hash among the
// group's listening sockets (workers still starting).
//
// Stack: fp-4 a lookup key (0), fp-8 the map index to select, fp-12 the
// client address, fp-16 the arrival counter, fp-20 the live half's first
// index, fp-24 the slot counted.
func program(socks, cfg, counts, base *ebpf.Map) asm.Instructions {
	selectSlot := func(label string) asm.Instructions { // key at fp-8
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, asm.R6).WithSymbol(label),
			asm.LoadMapPtr(asm.R2, socks.FD()),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnSkSelectReuseport.Call(),
		}
	}
	var p asm.Instructions
	p = append(p,
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.StoreImm(asm.RFP, -20, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, base.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "config"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.StoreMem(asm.RFP, -20, asm.R1, asm.Word),
		asm.LoadMapPtr(asm.R1, cfg.FD()).WithSymbol("config"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R7, asm.R0, 0, asm.Word), // active
		asm.LoadMem(asm.R8, asm.R0, 4, asm.Word), // mode
		asm.LoadMem(asm.R9, asm.R0, 8, asm.Word), // held
		// The arrival counter, then +1 (two CPUs may read the same value:
		// a turn taken twice, no harm).
		asm.LoadMem(asm.R1, asm.R0, 12, asm.Word),
		asm.StoreMem(asm.RFP, -16, asm.R1, asm.Word),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.Word, 12),
		asm.JEq.Imm(asm.R9, 0, "pick"),
		asm.StoreImm(asm.RFP, -8, Hold, asm.Word),
	)
	p = append(p, selectSlot("hold")...)
	p = append(p,
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.JEq.Imm(asm.R7, 0, "pass").WithSymbol("pick"),
		asm.JGT.Imm(asm.R7, MaxSlots, "pass"), // a bound the verifier can see
		asm.LoadMem(asm.R9, asm.RFP, -16, asm.Word),
		asm.JEq.Imm(asm.R8, int32(Even), "spread"),
		asm.LoadMem(asm.R9, asm.R6, mdHash, asm.Word), // sticky without an address

		asm.Mov.Imm(asm.R2, 12), // IPv4 source address
		asm.LoadMem(asm.R1, asm.R6, mdEthProtocol, asm.Word),
		asm.JEq.Imm(asm.R1, ethIPv4, "load"),
		asm.Mov.Imm(asm.R2, 8+12), // the last word of the IPv6 source
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("load"),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -12),
		asm.Mov.Imm(asm.R4, 4),
		asm.Mov.Imm(asm.R5, 1), // BPF_HDR_START_NET
		asm.FnSkbLoadBytesRelative.Call(),
		asm.JNE.Imm(asm.R0, 0, "migrating"),
		asm.LoadMem(asm.R9, asm.RFP, -12, asm.Word),
		asm.Ja.Label("mix"),
		// A connection migrating off a closed socket comes without a
		// packet: its client is the socket's peer, so that it goes where
		// its client's new connections go. Neither: the hash decides.
		asm.LoadMem(asm.R1, asm.R6, mdMigratingSk, asm.DWord).WithSymbol("migrating"),
		asm.JEq.Imm(asm.R1, 0, "spread"),
		asm.LoadMem(asm.R2, asm.R1, bsFamily, asm.Word),
		asm.LoadMem(asm.R9, asm.R1, bsDstIP6w, asm.Word), // v4-mapped too
		asm.JNE.Imm(asm.R2, unix.AF_INET, "mix"),
		asm.LoadMem(asm.R9, asm.R1, bsDstIP4, asm.Word),
	)
	p = append(p, mix(asm.R9, "mix")...)
	p = append(p,
		asm.Mod.Reg32(asm.R9, asm.R7).WithSymbol("spread"), // first slot to try
		asm.Mov.Imm(asm.R8, 0),                             // slots tried
		asm.JGE.Reg(asm.R8, asm.R7, "pass").WithSymbol("loop"),
		asm.Mov.Reg(asm.R1, asm.R9),
		asm.Add.Reg(asm.R1, asm.R8),
		asm.Mod.Reg32(asm.R1, asm.R7),
		asm.StoreMem(asm.RFP, -24, asm.R1, asm.Word),
		asm.LoadMem(asm.R2, asm.RFP, -20, asm.Word),
		asm.Add.Reg32(asm.R1, asm.R2),
		asm.StoreMem(asm.RFP, -8, asm.R1, asm.Word),
	)
	p = append(p, selectSlot("try")...)
	p = append(p,
		asm.JNE.Imm(asm.R0, 0, "next"),
		// Count the connection in its slot (status shows each worker's),
		// whichever half it is in.
		asm.LoadMapPtr(asm.R1, counts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -24),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		asm.Ja.Label("pass"),
		asm.Add.Imm(asm.R8, 1).WithSymbol("next"),
		asm.Ja.Label("loop"),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("pass"), // SK_PASS
		asm.Return(),
	)
	return p
}

// mix is a 32-bit integer hash (lowbias32, by Chris Wellons) of r in place
// (r1 is scratch), its first instruction labelled label: every bit of a
// client address moves the slot.
func mix(r asm.Register, label string) asm.Instructions {
	xorShift := func() asm.Instructions {
		return asm.Instructions{asm.Mov.Reg32(asm.R1, r), asm.RSh.Imm32(asm.R1, 16), asm.Xor.Reg32(r, asm.R1)}
	}
	var p asm.Instructions
	p = append(p, xorShift()...)
	p[0] = p[0].WithSymbol(label)
	p = append(p, asm.Mul.Imm32(r, 0x7feb352d))
	p = append(p, asm.Mov.Reg32(asm.R1, r), asm.RSh.Imm32(asm.R1, 15), asm.Xor.Reg32(r, asm.R1))
	p = append(p, asm.Mul.Imm32(r, -2073254261)) // 0x846ca68b
	return append(p, xorShift()...)
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
